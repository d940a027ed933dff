"""The user story of issue 5, end to end: a profiler-server (SQLite, PostgreSQL), the sample
apps under `profiler-host run` (gunicorn sync workers with and without --preload, uvicorn)
and a real Prometheus scraping the server. A known mix of requests goes in (two rounds, so
Prometheus sees the counters grow); what a user checks comes out: how many requests were
stored per route for the sampling settings, each stored tree's calls as the route's code
implies them (sized from the request and its JSON answer), the expected stacks in
`/api/flamegraph`, and the same stacks and per-route totals in Prometheus."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from profiler_server.exports.folded import WALL_FIELDS
from tests.helpers import eventually, nodes, stored_requests
from tests.processes import GUNICORN, UVICORN, HttpProcess, ServerProcess, serve_profiled
from tests.prometheus_server import Prometheus, running_prometheus
from tests.test_host_async import only
from tests.test_host_e2e import tree

SECRET = "story-secret"
FORCED = {"X-Profiler-Force": SECRET}
NOT_FORCED = ({}, {"X-Profiler-Force": "wrong"})
ROUNDS = 2
ORDER_IDS = (1, 2, 3)
PRODUCT_IDS = (1, 2)
CARTS = (
    {"customer_id": 1, "items": [{"product_id": 2, "quantity": 1}]},
    {  # product 4 twice: one cart line; five of 41: the bulk discount
        "customer_id": 2,
        "items": [
            {"product_id": 4, "quantity": 1},
            {"product_id": 41, "quantity": 5},
            {"product_id": 4, "quantity": 2},
        ],
        "coupon": "WELCOME10",
    },
)
# every stack series of its own (no "(other)"), so each expected stack is one in Prometheus
SERVER_OPTIONS = ("--top-k", "5000", "--top-functions", "5000")


def fn(name: str) -> str:
    return "profiling_target." + name


TRANSACTION = fn("shop.database:Database.transaction")
CONNECT = [fn("shop.database:Database.ensure"), fn("shop.database:Database._connect")]
PRODUCT_FROM_ROW = fn("shop.models:Product.from_row")
ORDER_LINE_FROM_ROW = fn("shop.models:OrderLine.from_row")
PLACEHOLDERS = fn("shop.repository:placeholders")
SHOP_ENTRY = fn("shop.service:Shop.entry")
QUOTE_ITEM = fn("shop.pricing:Pricer.quote_item")
BEST_DISCOUNT = fn("shop.pricing:Pricer.best_discount")
# Pricer.standard(): two category sales, a bulk buy, loyalty; each rule asked once per line
RULES = [
    fn("shop.pricing:category_sale.<locals>.rule"),
    fn("shop.pricing:category_sale.<locals>.rule"),
    fn("shop.pricing:bulk_buy.<locals>.rule"),
    fn("shop.pricing:loyalty.<locals>.rule"),
]
RECOMMENDATIONS = fn("shop.service:Shop.recommendations")
CATALOG_ENTRY_JSON = fn("shop.pages:CatalogEntry.to_json")
SHOP_CHECKOUT = fn("shop.service:Shop.checkout")
READ_ITEM = fn("shop.checkout:CheckoutRequest.read_item")
POSITIVE_INT = fn("shop.checkout:positive_int")


def names(node: dict) -> list[str]:
    return [child["function"] for child in node["children"]]


def child(node: dict, function: str) -> dict:
    (found,) = [c for c in node["children"] if c["function"] == function]
    return found


def times(count: int, calls: list[str]) -> list[str]:
    return calls * count


def check_entry(entry: dict) -> None:
    """Shop.entry: the price for one (every discount rule asked, tax) and the stock status."""
    assert names(entry) == [QUOTE_ITEM, fn("shop.inventory:stock_status")]
    quote = entry["children"][0]
    assert names(quote) == [BEST_DISCOUNT, fn("shop.tax:TaxTable.rate_for")]
    assert names(quote["children"][0]) == RULES


def check_recommendations(node: dict) -> int:
    """Shop.recommendations: one transaction, the recommender, then one entry per product."""
    calls = names(node)
    count = calls.count(SHOP_ENTRY)
    assert calls == [
        TRANSACTION,
        fn("shop.repository:Orders.__init__"),
        fn("shop.repository:Products.__init__"),
        fn("shop.recommendations:Recommender.__init__"),
        fn("shop.recommendations:Recommender.for_products"),
        *times(count, [SHOP_ENTRY]),
    ]
    assert names(node["children"][0]) == CONNECT
    finder = names(node["children"][4])
    assert finder[:3] == [
        fn("shop.repository:Orders.baskets_containing"),
        fn("shop.recommendations:co_purchases"),
        fn("shop.repository:Products.get_many"),
    ]
    for entry in node["children"][5:]:
        check_entry(entry)
    return count


def check_product_lookup(node: dict) -> None:
    """Shop.product: one row read, one entry."""
    assert names(node) == [
        TRANSACTION,
        fn("shop.repository:Products.__init__"),
        fn("shop.repository:Products.get"),
        SHOP_ENTRY,
    ]
    assert names(node["children"][2]) == [PRODUCT_FROM_ROW]
    check_entry(node["children"][3])


def check_product_json(node: dict, recommended: int) -> None:
    assert names(node) == times(1 + recommended, [CATALOG_ENTRY_JSON])


@dataclass(frozen=True)
class Web:
    """One web layer of the shop: where its handlers live and what its routes are called."""

    module: str  # profiling_target.wsgi / .asgi
    routes: dict[str, str]  # order, product, checkout -> the route as the server stores it

    def handler(self, name: str) -> str:
        return f"{self.module}:{name}"


FLASK = Web(
    fn("wsgi"),
    {
        "order": "/orders/<int:order_id>",
        "product": "/products/<int:product_id>",
        "checkout": "/checkout",
    },
)
STARLETTE = Web(
    fn("asgi"),
    {
        "order": "/orders/{order_id:int}",
        "product": "/products/{product_id:int}",
        "checkout": "/checkout",
    },
)


def lane_of(request: dict, node: dict) -> dict:
    (lane,) = [lane for lane in request["lanes"] if node in nodes(lane["root"])]
    return lane


def check_order(request: dict, web: Web) -> tuple[int, int]:
    """GET /orders/{id}: the order's rows, its customer, its products, recommendations, JSON.
    Returns (order lines, recommendations)."""
    handler = only(request, web.handler("order"))
    lane = lane_of(request, handler)
    if web is FLASK:
        assert lane["kind"] == "main" and lane["root"]["children"] == [handler]
    else:  # a plain def endpoint: Starlette hands it to anyio's thread pool, a lane of its own
        assert lane["kind"] == "executor" and lane["root"]["children"] == [handler]
    assert names(handler) == [
        web.handler("current_shop"),
        fn("shop.service:Shop.order"),
        fn("shop.pages:OrderDetail.to_json"),
    ]
    service, document = handler["children"][1:]
    assert names(service) == [
        TRANSACTION,
        fn("shop.repository:Orders.__init__"),
        fn("shop.repository:Orders.get"),
        fn("shop.repository:Customers.__init__"),
        fn("shop.repository:Customers.get"),
        fn("shop.repository:Products.__init__"),
        fn("shop.repository:Products.get_many"),
        RECOMMENDATIONS,
    ]
    assert names(service["children"][0]) == CONNECT
    rows = names(service["children"][2])
    lines = rows.count(ORDER_LINE_FROM_ROW)
    assert rows == [*times(lines, [ORDER_LINE_FROM_ROW]), fn("shop.models:Order.from_row")]
    assert names(service["children"][4]) == [fn("shop.models:Customer.from_row")]
    # one product per line (a line per product): one row each from one query
    assert names(service["children"][6]) == [PLACEHOLDERS, *times(lines, [PRODUCT_FROM_ROW])]
    recommended = check_recommendations(service["children"][7])
    assert names(document) == [
        fn("shop.models:Order.to_json"),
        fn("shop.models:Customer.to_json"),
        *times(recommended, [CATALOG_ENTRY_JSON]),
    ]
    assert names(document["children"][0]) == [
        *times(lines, [fn("shop.models:OrderLine.to_json")]),
        fn("shop.models:PricedLines.totals_json"),
    ]
    return lines, recommended


def check_product(request: dict, web: Web) -> tuple[int]:
    """GET /products/{id}: the product and its recommendations, then JSON.
    Returns (recommendations,)."""
    handler = only(request, web.handler("product"))
    main = request["lanes"][0]
    assert main["kind"] == "main" and main["root"]["children"] == [handler]
    if web is FLASK:
        page = fn("shop.service:Shop.product_page")
        assert names(handler) == [
            web.handler("current_shop"),
            page,
            fn("shop.pages:ProductPage.to_json"),
        ]
        parts = handler["children"][1]
        assert names(parts) == [fn("shop.service:Shop.product"), RECOMMENDATIONS]
        product, recommendations = parts["children"]
    else:  # asyncio.gather of two asyncio.to_thread: a task lane each, their executor work
        page = fn("shop.async_service:AsyncShop.product_page")
        assert names(handler) == [
            web.handler("current_shop"),
            page,
            fn("shop.pages:ProductPage.to_json"),
        ]
        fan_out = handler["children"][1]
        assert fan_out["children"] == [] and fan_out["suspensions"] >= 1
        tasks = [lane for lane in request["lanes"] if lane["parent_node"] == fan_out["id"]]
        assert [lane["kind"] for lane in tasks] == ["task", "task"], request["lanes"]
        work = {}
        for task in tasks:  # (a worker thread the pool starts is a thread lane of its own)
            (executor,) = [
                lane
                for lane in request["lanes"]
                if lane["parent_lane"] == task["id"] and lane["kind"] == "executor"
            ]
            (call,) = executor["root"]["children"]
            work[call["function"]] = call
        assert work.keys() == {fn("shop.service:Shop.product"), RECOMMENDATIONS}
        product, recommendations = work[fn("shop.service:Shop.product")], work[RECOMMENDATIONS]
    check_product_lookup(product)
    recommended = check_recommendations(recommendations)
    check_product_json(handler["children"][2], recommended)
    return (recommended,)


def check_checkout(request: dict, web: Web) -> tuple[int, int]:
    """POST /checkout: the body read (each item, the customer id), then one write transaction
    that prices, reserves and records every cart line, then the receipt.
    Returns (items in the body, cart lines)."""
    handler = only(request, web.handler("checkout"))
    from_json = fn("shop.checkout:CheckoutRequest.from_json")
    receipt = fn("shop.pages:Receipt.to_json")
    if web is FLASK:
        assert names(handler) == [web.handler("current_shop"), from_json, SHOP_CHECKOUT, receipt]
        service = handler["children"][2]
    else:  # run_in_threadpool: the service runs in a worker thread's lane, under the handler
        assert names(handler) == [from_json, web.handler("current_shop"), receipt]
        service = only(request, SHOP_CHECKOUT)
        lane = lane_of(request, service)
        assert lane["kind"] == "executor" and lane["parent_node"] == handler["id"]
        assert lane["root"]["children"] == [service]
    body = child(handler, from_json)
    items = names(body).count(READ_ITEM)
    assert names(body) == [*times(items, [READ_ITEM]), POSITIVE_INT]  # the customer id last
    for read in body["children"][:items]:
        assert names(read) == [POSITIVE_INT, POSITIVE_INT]  # product id, quantity
    calls = names(service)
    assert calls == [
        TRANSACTION,
        fn("shop.repository:Customers.__init__"),
        fn("shop.repository:Customers.get"),
        fn("shop.repository:Products.__init__"),
        fn("shop.repository:Products.get_many"),
        fn("shop.checkout:CheckoutRequest.cart"),
        fn("shop.inventory:ensure_available"),
        fn("shop.pricing:Pricer.quote_cart"),
        fn("shop.inventory:reserve"),
        fn("shop.repository:Orders.__init__"),
        fn("shop.repository:Orders.add"),
    ]
    found = {node["function"]: node for node in service["children"]}
    lines = names(found[fn("shop.repository:Products.get_many")]).count(PRODUCT_FROM_ROW)
    assert names(found[fn("shop.repository:Products.get_many")]) == [
        PLACEHOLDERS,
        *times(lines, [PRODUCT_FROM_ROW]),
    ]
    assert names(found[fn("shop.pricing:Pricer.quote_cart")]) == [
        fn("shop.money:Money.total"),  # the subtotal the coupon is checked against
        fn("shop.pricing:Pricer.coupon_for"),
        *times(lines, [QUOTE_ITEM]),
        fn("shop.money:Money.total"),
        fn("shop.pricing:ShippingPolicy.cost"),
    ]
    for quote in found[fn("shop.pricing:Pricer.quote_cart")]["children"][2 : 2 + lines]:
        assert names(quote)[0] == BEST_DISCOUNT and names(quote["children"][0]) == RULES
    take = fn("shop.repository:Products.take_stock")
    assert names(found[fn("shop.inventory:reserve")]) == times(lines, [take])
    assert names(found[fn("shop.repository:Orders.add")]) == times(
        lines, [fn("shop.pricing:LineQuote.discount"), fn("shop.pricing:LineQuote.tax")]
    )
    document = child(handler, receipt)
    assert names(document) == [
        fn("shop.models:Customer.to_json"),
        fn("shop.pricing:CartQuote.to_json"),
    ]
    assert names(document["children"][1]) == [
        *times(lines, [fn("shop.pricing:LineQuote.to_json")]),
        fn("shop.models:PricedLines.totals_json"),
    ]
    return items, lines


CHECKS: dict[str, Callable[[dict, Web], tuple]] = {
    "order": check_order,
    "product": check_product,
    "checkout": check_checkout,
}


def shape_of(kind: str, body: dict | None, answer: dict) -> tuple:
    """What the check of a stored tree returns, from the request and its answer."""
    if kind == "order":
        return len(answer["lines"]), len(answer["recommendations"])
    if kind == "product":
        return (len(answer["recommendations"]),)
    assert body is not None
    return len(body["items"]), len(answer["lines"])


def expected_stacks(web: Web, kind: str, shapes: list[tuple]) -> dict[str, int]:
    """Stacks (root→leaf) the route's code implies, with their calls over `shapes`."""
    handler = web.handler

    def stack(*frames: str) -> str:
        return ";".join(frames)

    if kind == "order":
        service = [handler("order"), fn("shop.service:Shop.order")]
        return {
            stack(*service, fn("shop.repository:Orders.get"), ORDER_LINE_FROM_ROW): sum(
                lines for lines, _ in shapes
            ),
            stack(*service, RECOMMENDATIONS, SHOP_ENTRY, QUOTE_ITEM, BEST_DISCOUNT, RULES[0]): (
                2 * sum(recommended for _, recommended in shapes)  # two category rules
            ),
        }
    if kind == "product":
        to_json = [handler("product"), fn("shop.pages:ProductPage.to_json"), CATALOG_ENTRY_JSON]
        found = {stack(*to_json): sum(1 + recommended for (recommended,) in shapes)}
        if web is FLASK:
            lookup = [
                handler("product"),
                fn("shop.service:Shop.product_page"),
                fn("shop.service:Shop.product"),
                fn("shop.repository:Products.get"),
                PRODUCT_FROM_ROW,
            ]
        else:
            lookup = [handler("product"), fn("shop.async_service:AsyncShop.product_page")]
        found[stack(*lookup)] = len(shapes)
        return found
    reserve = [
        handler("checkout"),
        SHOP_CHECKOUT,
        fn("shop.inventory:reserve"),
        fn("shop.repository:Products.take_stock"),
    ]
    body = [handler("checkout"), fn("shop.checkout:CheckoutRequest.from_json"), READ_ITEM]
    return {
        stack(*reserve): sum(lines for _, lines in shapes),
        stack(*body, POSITIVE_INT): 2 * sum(items for items, _ in shapes),
    }


@dataclass
class Sent:
    kind: str
    sampled: bool  # expected to be stored
    shape: tuple


def drive(app: HttpProcess, web: Web, every_request_sampled: bool) -> list[Sent]:
    """One round: each route forced, not forced, and with a wrong secret."""
    sent = []
    with httpx.Client(base_url=app.url, timeout=30) as client:
        for headers in (FORCED, *NOT_FORCED):
            sampled = headers is FORCED or every_request_sampled
            plan: list[tuple[str, str, dict | None]] = [
                *(("order", f"/orders/{i}", None) for i in ORDER_IDS),
                *(("product", f"/products/{i}", None) for i in PRODUCT_IDS),
                *(("checkout", "/checkout", cart) for cart in CARTS),
            ]
            if headers is not FORCED:  # one of each route is enough for the unforced
                plan = [plan[0], plan[len(ORDER_IDS)], plan[-1]]
            for kind, path, body in plan:
                if body is None:
                    response = client.get(path, headers=headers)
                else:
                    response = client.post(path, json=body, headers=headers)
                assert response.status_code == (201 if body else 200), response.text
                sent.append(Sent(kind, sampled, shape_of(kind, body, response.json())))
    return sent


def stored_by_route(http: str, service: str) -> Counter:
    return Counter(r["route"] for r in stored_requests(http, service=service))


def flamegraph(
    http: str, service: str, route: str | None = None, value: str = "running"
) -> list[dict]:
    params = {"service": service, "format": "json", "value": value}
    if route is not None:
        params["route"] = route
    response = httpx.get(http + "/api/flamegraph", params=params, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()["stacks"]


def label(value: str) -> str:
    """A PromQL string literal."""
    return json.dumps(value)


def wait_scraped(prom: Prometheus, server: ServerProcess, service: str) -> None:
    """Until Prometheus' last scrape holds every call the server stored for `service`."""

    def stored_calls() -> int:
        return sum(s["calls"] for s in flamegraph(server.http, service))

    query = f"sum(profiler_stack_calls_total{{service={label(service)}}})"
    done = prom.wait_for(lambda: prom.scalar(query) == stored_calls() > 0, timeout=30)
    assert done, (prom.query(query), stored_calls(), prom.targets(), prom.log_text())


@dataclass(frozen=True)
class AppSetup:
    service: str
    web: Web
    command: tuple[str, ...]
    options: tuple[str, ...]
    every_request_sampled: bool


APPS = [
    AppSetup(  # sampling off: only requests with the secret are recorded
        "shop-flask",
        FLASK,
        (*GUNICORN, "profiling_target.wsgi:app"),
        ("--sample-rate", "0", "--force-secret", SECRET),
        False,
    ),
    AppSetup(
        "shop-flask-preload",
        FLASK,
        (*GUNICORN, "--preload", "profiling_target.wsgi:app"),
        ("--sample-rate", "0", "--force-secret", SECRET),
        False,
    ),
    AppSetup(  # a rate far above the traffic: every request is recorded
        "shop-starlette",
        STARLETTE,
        tuple(UVICORN),
        ("--sample-rate", "1000", "--force-secret", SECRET),
        True,
    ),
]


@pytest.mark.parametrize("setup", APPS, ids=[app.service for app in APPS])
def test_user_story(db_url: str, tmp_path: Path, setup: AppSetup) -> None:
    web, service = setup.web, setup.service
    sent: list[Sent] = []
    with ExitStack() as stack:
        server = ServerProcess(db_url, tmp_path / "server.log", *SERVER_OPTIONS)
        stack.callback(server.stop, grace=10)
        prom = stack.enter_context(
            running_prometheus([f"127.0.0.1:{server.http_port}"], tmp_path / "prom")
        )
        app = serve_profiled(server, tmp_path, service, *setup.command, options=setup.options)
        try:
            for round_ in range(1, ROUNDS + 1):
                sent += drive(app, web, setup.every_request_sampled)
                want = Counter(web.routes[s.kind] for s in sent if s.sampled)
                arrived = eventually(
                    lambda w=want: +(w - stored_by_route(server.http, service)) == Counter(),
                    timeout=30,
                )
                assert arrived, (round_, want, stored_by_route(server.http, service))
                if round_ < ROUNDS:  # Prometheus must see the counters before they grow
                    wait_scraped(prom, server, service)
        finally:
            app.stop(grace=15)  # the host flushes what is left at exit

        # 1. sampling: exactly the requests the settings record, per route
        stored = stored_requests(server.http, service=service)
        counts = Counter(r["route"] for r in stored if r["route"] in web.routes.values())
        want = Counter(web.routes[s.kind] for s in sent if s.sampled)
        assert counts == want
        assert want[web.routes["order"]] == ROUNDS * (
            len(ORDER_IDS) + (2 if setup.every_request_sampled else 0)
        )
        if not setup.every_request_sampled:
            assert len(stored) == len(ORDER_IDS + PRODUCT_IDS + CARTS) * ROUNDS  # nothing else

        # 2. each stored tree has the calls its route's code implies, sized by its answer
        kinds = {route: kind for kind, route in web.routes.items()}
        shapes: dict[str, list[tuple]] = defaultdict(list)
        tree_self: dict[str, int] = defaultdict(int)  # running, the lanes' roots included
        tree_wall: dict[str, int] = defaultdict(int)  # every state: the lanes' durations
        for summary in stored:
            if summary["route"] not in kinds:
                continue  # /health polls, recorded at rate 1000
            request = tree(server, summary["id"])
            kind = kinds[summary["route"]]
            assert request["truncated"] is False
            assert request["status"] == (201 if kind == "checkout" else 200)
            assert request["method"] == ("POST" if kind == "checkout" else "GET")
            shapes[kind].append(CHECKS[kind](request, web))
            for lane in request["lanes"]:
                lane_nodes = nodes(lane["root"])
                tree_self[summary["route"]] += sum(n["self_ns"] for n in lane_nodes)
                lane_wall = sum(n[field] for n in lane_nodes for field in WALL_FIELDS)
                assert lane_wall == lane["root"]["end_ns"] - lane["root"]["start_ns"]
                tree_wall[summary["route"]] += lane_wall
        for kind in web.routes:
            assert sorted(shapes[kind]) == sorted(
                s.shape for s in sent if s.kind == kind and s.sampled
            )

        # 3. the flame graph: the expected stacks, with their calls and positive self time
        response = httpx.get(
            server.http + "/api/flamegraph",
            params={"service": service, "format": "folded"},
            timeout=30,
        )
        assert response.status_code == 200, response.text
        folded = dict(line.rsplit(" ", 1) for line in response.text.splitlines())
        stored_self: dict[str, int] = {}
        per_stack: dict[tuple[str, str], dict] = {}
        for kind, route in web.routes.items():
            stacks = flamegraph(server.http, service, route)
            per_stack.update({(route, s["stack"]): s for s in stacks})
            stored_self[route] = sum(s["value"] for s in stacks)
            # the aggregate holds every call of the stored trees, lanes included, and all of
            # the lanes' time
            assert stored_self[route] == tree_self[route] > 0
            wall = flamegraph(server.http, service, route, value="wall")
            assert sum(s["value"] for s in wall) == tree_wall[route] >= tree_self[route]
            calls = {s["stack"]: s["calls"] for s in stacks}
            for signature, expected_calls in expected_stacks(web, kind, shapes[kind]).items():
                assert int(folded.get(signature, 0)) > 0, (signature, sorted(folded)[:20])
                assert calls.get(signature) == expected_calls, signature

        # 4. Prometheus: the same stacks, growing, and per route the stored totals
        wait_scraped(prom, server, service)
        assert prom.scalar('up{job="profiler"}') == 1
        where = f"service={label(service)}"
        for kind, route in web.routes.items():
            for signature, expected_calls in expected_stacks(web, kind, shapes[kind]).items():
                series = f"{where}, route={label(route)}, stack={label(signature)}"
                seconds = prom.scalar(f"profiler_stack_self_seconds_total{{{series}}}")
                assert seconds == pytest.approx(per_stack[route, signature]["value"] * 1e-9)
                assert prom.scalar(f"profiler_stack_calls_total{{{series}}}") == expected_calls
                rate = prom.scalar(f"rate(profiler_stack_self_seconds_total{{{series}}}[1m])")
                assert rate is not None and rate > 0, (signature, rate)
        by_route = {
            r["metric"]["route"]: float(r["value"][1])
            for r in prom.query(f"sum by (route) (profiler_stack_self_seconds_total{{{where}}})")
        }
        for route, ns in stored_self.items():
            assert by_route[route] == pytest.approx(ns * 1e-9, rel=1e-6), route
        durations = {
            r["metric"]["route"]: float(r["value"][1])
            for r in prom.query(f"profiler_request_duration_seconds_count{{{where}}}")
        }
        assert {route: int(durations[route]) for route in counts} == dict(counts)
        requests_stored = f"sum(profiler_requests_stored_total{{{where}}})"
        assert prom.wait_for(lambda: prom.scalar(requests_stored) == len(stored)), (
            prom.scalar(requests_stored),
            len(stored),
        )


def test_to_thread_work_stacks_under_the_awaiting_handler(tmp_path: Path) -> None:
    """Starlette's product page awaits asyncio.gather(asyncio.to_thread(...), ...): in the
    stored tree the work hangs under the handler (handler → task lane → executor lane), so
    the flame graph and Prometheus should show it under the handler too."""
    server = ServerProcess(f"sqlite:///{tmp_path / 'profiles.db'}", tmp_path / "server.log")
    try:
        options = ("--sample-rate", "0", "--force-secret", SECRET)
        app = serve_profiled(server, tmp_path, "to-thread", *UVICORN, options=options)
        try:
            response = httpx.get(app.url + "/products/1", headers=FORCED, timeout=30)
            assert response.status_code == 200
            assert eventually(lambda: stored_requests(server.http, service="to-thread"))
        finally:
            app.stop(grace=15)
        stacks = {s["stack"] for s in flamegraph(server.http, "to-thread")}
    finally:
        server.stop(grace=10)
    lookup = fn("shop.service:Shop.product") + ";" + fn("shop.repository:Products.get")
    page = STARLETTE.handler("product") + ";" + fn("shop.async_service:AsyncShop.product_page")
    assert f"{page};{lookup}" in stacks, sorted(s for s in stacks if "Shop.product" in s)
    assert lookup not in stacks  # not a root of its own
