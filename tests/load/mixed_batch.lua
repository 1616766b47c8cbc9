-- mixed_batch.lua — wrk load: JSON infer requests of batch 1..8 in turn
-- (each wrk thread cycles through the sizes), distinct data per size, so
-- the dynamic batcher packs uneven requests into buckets.
--   wrk -t2 -c32 -d5s -s tests/load/mixed_batch.lua http://127.0.0.1:8000/v2/models/mlp_sp_tp2/infer
-- env: TP_INPUT, TP_ROW_SHAPE (see common.lua); TP_MAX_ROWS (default 8).
local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local c = dofile(dir .. "common.lua")

local max_rows = tonumber(os.getenv("TP_MAX_ROWS") or "8")
local reqs, next_i = {}, 0

function init(args)
   local headers = {["Content-Type"] = "application/json"}
   for rows = 1, max_rows do
      reqs[rows] = wrk.format("POST", nil, headers, c.json_body(rows, rows))
   end
end

function request()
   next_i = next_i % max_rows + 1
   return reqs[next_i]
end

function done(summary, latency, requests)
   c.report(summary, latency)
end
