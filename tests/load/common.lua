-- common.lua — shared by the tpserve wrk scripts (loaded with dofile from
-- their directory): the request's shape from the environment, deterministic
-- data, KServe v2 bodies, and one machine-readable summary line.
--
-- env: TP_INPUT (input name, default x), TP_ROW_SHAPE (dims after the batch,
-- default 8,32: the example graph mlp_sp_tp2), TP_ROWS (batch, default 1).
local M = {}

M.input = os.getenv("TP_INPUT") or "x"
M.rows = tonumber(os.getenv("TP_ROWS") or "1")
M.row_shape = {}
for d in string.gmatch(os.getenv("TP_ROW_SHAPE") or "8,32", "%d+") do
   M.row_shape[#M.row_shape + 1] = tonumber(d)
end

local function row_elems()
   local n = 1
   for _, d in ipairs(M.row_shape) do n = n * d end
   return n
end

local function shape_json(rows)
   return "[" .. rows .. "," .. table.concat(M.row_shape, ",") .. "]"
end

-- Deterministic values in [-1, 1): distinct per seed, the same in every run.
function M.values(n, seed)
   local v, s = {}, seed * 2654435761 % 4294967296
   for i = 1, n do
      s = (s * 1664525 + 1013904223) % 4294967296
      v[i] = math.floor(s / 256) % 65536 / 32768 - 1
   end
   return v
end

-- JSON tensors: {"inputs":[{"name","shape","datatype","data"}]}.
function M.json_body(rows, seed)
   local v = M.values(rows * row_elems(), seed)
   for i = 1, #v do v[i] = string.format("%.6g", v[i]) end
   return '{"inputs":[{"name":"' .. M.input .. '","shape":' .. shape_json(rows)
      .. ',"datatype":"FP32","data":[' .. table.concat(v, ",") .. ']}]}'
end

-- Binary tensor data extension: a JSON header (its length goes in
-- Inference-Header-Content-Length), then the raw little-endian FP32 input;
-- the output is asked for as binary too. wrk embeds LuaJIT, so ffi packs
-- the floats exactly.
function M.binary_body(rows, seed)
   local ffi = require("ffi")
   local v = M.values(rows * row_elems(), seed)
   local buf = ffi.new("float[?]", #v)
   for i = 1, #v do buf[i - 1] = v[i] end
   local raw = ffi.string(buf, #v * 4)
   local header = '{"inputs":[{"name":"' .. M.input .. '","shape":' .. shape_json(rows)
      .. ',"datatype":"FP32","parameters":{"binary_data_size":' .. #raw .. '}}],'
      .. '"parameters":{"binary_data_output":true}}'
   return header .. raw, #header
end

-- One line bench_http.sh parses (latencies in microseconds).
function M.report(summary, latency)
   local e = summary.errors
   io.write(string.format(
      "TPBENCH requests=%d duration_us=%d rps=%.1f p50_us=%d p99_us=%d errors=%d non2xx=%d\n",
      summary.requests, summary.duration, summary.requests / (summary.duration / 1e6),
      latency:percentile(50), latency:percentile(99),
      e.connect + e.read + e.write + e.timeout, e.status))
end

return M
