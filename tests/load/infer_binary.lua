-- infer_binary.lua — wrk load: KServe v2 infer with the binary tensor data
-- extension both ways (Inference-Header-Content-Length request header,
-- binary_data_output).
--   wrk -t2 -c8 -d5s -s tests/load/infer_binary.lua http://127.0.0.1:8000/v2/models/mlp_sp_tp2/infer
-- env: TP_ROWS, TP_INPUT, TP_ROW_SHAPE (see common.lua).
local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local c = dofile(dir .. "common.lua")

local body, header_len = c.binary_body(c.rows, 1)
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/octet-stream"
wrk.headers["Inference-Header-Content-Length"] = tostring(header_len)
wrk.body = body

function done(summary, latency, requests)
   c.report(summary, latency)
end
