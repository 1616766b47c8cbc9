-- infer_json.lua — wrk load: KServe v2 infer with JSON tensors.
--   wrk -t2 -c8 -d5s -s tests/load/infer_json.lua http://127.0.0.1:8000/v2/models/mlp_sp_tp2/infer
-- env: TP_ROWS, TP_INPUT, TP_ROW_SHAPE (see common.lua).
local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local c = dofile(dir .. "common.lua")

wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = c.json_body(c.rows, 1)

function done(summary, latency, requests)
   c.report(summary, latency)
end
