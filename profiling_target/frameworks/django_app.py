"""A one-module Django project served over ASGI (`app`; `wsgi` under gunicorn): sync
views run through asgiref's `sync_to_async` in a per-request thread-sensitive context
(whose executor is joined in a thread of its own as the request ends), async views on the
loop; `fast/<id>/` is an async view that answers at once, for the overhead benchmarks;
`shop/` nests `include()`s (whose routes Django joins into one template)."""

from __future__ import annotations

import asyncio

import django
from django.conf import settings

settings.configure(
    DEBUG=False,
    SECRET_KEY="not-a-secret-for-tests",
    ALLOWED_HOSTS=["127.0.0.1", "localhost"],
    ROOT_URLCONF=__name__,
    INSTALLED_APPS=[],
    MIDDLEWARE=["django.middleware.common.CommonMiddleware"],
)
django.setup()

from django.core.asgi import get_asgi_application  # noqa: E402 - after settings
from django.core.wsgi import get_wsgi_application  # noqa: E402
from django.http import Http404, HttpRequest, JsonResponse  # noqa: E402
from django.urls import include, path  # noqa: E402


def health(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"ok": True})


def item(request: HttpRequest, item_id: int) -> JsonResponse:
    if item_id == 0:
        raise Http404("no such item")
    return JsonResponse({"id": item_id})


async def async_item(request: HttpRequest, item_id: int) -> JsonResponse:
    await asyncio.sleep(0.001)
    return JsonResponse({"id": item_id})


async def fast_item(request: HttpRequest, item_id: int) -> JsonResponse:
    return JsonResponse({"id": item_id, "name": f"item {item_id}"})


urlpatterns = [
    path("health", health),
    path("items/<int:item_id>/", item),
    path("async/<int:item_id>/", async_item),
    path("fast/<int:item_id>/", fast_item),
    path(
        "shop/",
        include(
            [
                path("items/<int:item_id>/", item),
                path("orders/", include([path("<int:item_id>/", item)])),
            ]
        ),
    ),
]

app = get_asgi_application()
wsgi = get_wsgi_application()  # the same views under gunicorn
