-- wrk script for the overhead benchmark: GET the paths in $WRK_PATHS (comma-separated), in
-- turn on every connection
local requests = {}
local i = 0

-- built here, not at load: wrk sets the Host header (HTTP/1.1 needs it) before init
init = function(args)
  for path in string.gmatch(os.getenv("WRK_PATHS") or "/health", "[^,]+") do
    requests[#requests + 1] = wrk.format("GET", path)
  end
end

request = function()
  i = i % #requests + 1
  return requests[i]
end
