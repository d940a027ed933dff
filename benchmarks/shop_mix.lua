-- wrk script for the overhead benchmark: the shop's route mix, in turn on every connection
local checkout = '{"customer_id": 1, "items": [{"product_id": 1, "quantity": 1}]}'
local requests = {}
local i = 0

-- built here, not at load: wrk sets the Host header (HTTP/1.1 needs it) before init
init = function(args)
  requests = {
    wrk.format("GET", "/products/1"),
    wrk.format("GET", "/orders/1"),
    wrk.format("GET", "/products?page=1"),
    wrk.format("POST", "/checkout", {["Content-Type"] = "application/json"}, checkout),
  }
end

request = function()
  i = i % #requests + 1
  return requests[i]
end
