# tpserve — build, test, run.  `make help` lists the targets.
#
# Library sources are found by wildcard so each module (and each test) is one
# file added, never a Makefile edit.  `make asan` builds the same tree into
# build/asan with AddressSanitizer + UBSan and runs the same suite.

BUILD   ?= build
CC      ?= gcc
PYTHON  ?= python3
SAN     ?=
OPT     ?= -O2
# Assertions (util/invariant.h) are on under a sanitizer (make asan) and with
# DEBUG=1; the default build defines NDEBUG.
DEBUG   ?=
NDEBUG  := $(if $(or $(SAN),$(DEBUG)),,-DNDEBUG)
PKGS    := jansson libmicrohttpd openblas zlib
CFLAGS  := -std=c11 -D_GNU_SOURCE $(OPT) $(NDEBUG) -g -Wall -Wextra -Werror -pthread $(SAN)
# Layers, enforced by what each directory may include: util/ (status, log,
# JSON helpers) depends on nothing; engine/ on util/; kernels/ on util/ and
# the engine's kernel API (backend.h, ops.h, tensor.h, ...); server/ on util/
# and engine/, never kernels/. Tests and benchmarks see everything.
INC_util    := -Iutil
INC_engine  := -Iutil -Iengine
INC_kernels := -Iutil -Iengine -Ikernels
INC_server  := -Iutil -Iengine -Iserver
INC_all     := -Iutil -Iengine -Ikernels -Iserver
# Recursive (=) so pkg-config runs after deps.sh has installed the packages.
PKG_CFLAGS = $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
LDLIBS     = $(shell pkg-config --libs $(PKGS) 2>/dev/null) -ldl -lstdc++ -lm -pthread $(SAN)
# C++ only where a C++ library is wrapped (server/numtext_charconv.cc: <charconv>): same
# warnings, no exceptions or RTTI crossing into C.
CXX     ?= g++
CXXFLAGS := -std=c++17 $(OPT) $(NDEBUG) -g -Wall -Wextra -Werror -fno-exceptions -fno-rtti -pthread \
            $(INC_server) $(SAN)
CHECK_LIBS = $(shell pkg-config --libs check 2>/dev/null)

LIB_SRCS  := $(wildcard util/*.c engine/*.c kernels/cpu/*.c kernels/common/*.c) \
             $(filter-out server/main.c,$(wildcard server/*.c))
TEST_SRCS := $(wildcard tests/unit/test_*.c)
TEST_BINS := $(TEST_SRCS:tests/unit/%.c=$(BUILD)/tests/%)
CU_SRCS   := $(wildcard kernels/cuda/*.cu)
CU_OBJS   := $(CU_SRCS:%.cu=$(BUILD)/cuda/%.o)
# With nvcc the cuda backend is built: its registry entry (cuda_kind.c:
# capabilities, known without a device) is part of tpserve, its device code
# (the other kernels/cuda/*.c + *.cu, which link libcudart, libcublasLt and
# libnccl) is $(CUDA_SO), which tpserve loads only for a cuda backend
# (docs/architecture.md). Test and benchmark binaries link the device code
# in; its device tests say "skipped: no CUDA device" without a GPU.
NVCC      := $(shell command -v nvcc 2>/dev/null)
CUDA_KIND := kernels/cuda/cuda_kind.c
ifneq ($(NVCC),)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
LIB_SRCS  += $(CUDA_KIND)
CFLAGS    += -DTP_HAVE_CUDA -I$(CUDA_HOME)/include
CUDA_LIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart -lcublasLt -lnccl -lstdc++
CUDA_SO   := $(BUILD)/libtpserve-cuda.so
CUDA_DEV_OBJS := $(patsubst %.c,$(BUILD)/obj/%.o,$(filter-out $(CUDA_KIND),$(wildcard kernels/cuda/*.c))) $(CU_OBJS)
# What a test or benchmark binary links besides the library.
CUDA_LINK := $(CUDA_DEV_OBJS) $(CUDA_LIBS)
# The library resolves the engine's symbols in tpserve: exported, and every
# library object linked whether tpserve itself calls it or not.
TPSERVE_LINK := -rdynamic -Wl,--whole-archive $(BUILD)/libtpserve.a -Wl,--no-whole-archive
else
TPSERVE_LINK := $(BUILD)/libtpserve.a
endif
# Where an install puts $(CUDA_SO) (tpserve looks next to itself first).
LIBDIR    ?= /usr/local/lib/tpserve
LIB_OBJS  := $(LIB_SRCS:%.c=$(BUILD)/obj/%.o) $(patsubst %.cc,$(BUILD)/obj/%.o,$(wildcard server/*.cc))
# nvcc's own warnings (its front end's, e.g. an unknown pragma) are errors
# as the host compiler's are: without --Werror they scrolled past in every build.
NVFLAGS   := -std=c++17 -O2 $(INC_kernels) --Werror all-warnings --compiler-options -Wall,-Werror,-fPIC \
             -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90a,code=sm_90a
GRAPHS    := $(BUILD)/graphs/.stamp
DEPS_OK   := $(BUILD)/.deps

.PHONY: all test suite unit integration static-checks asan run clean help cuda graphs deps bench bench-passes bench-ranks fuzz bench-http bench-gpu bench-ranks-ctx
.PHONY: test-cpus cuda-double test-numtext-exhaustive test-math-exhaustive bench-codec test-libmicrohttpd

all: $(BUILD)/tpserve cuda

help:
	@echo "make            build build/tpserve (and build/libtpserve-cuda.so when nvcc exists)"
	@echo "make test       build and run unit + integration tests"
	@echo "make asan       the same suite under AddressSanitizer + UBSan"
	@echo "make static-checks  prove the build refuses an op without its descriptor and an include across layers"
	@echo "make test-cpus  the numeric tests under every OpenBLAS CPU kernel set this CPU can run"
	@echo "make run        install deps, build, serve the example graph (cpu)"
	@echo "make graphs     regenerate example graphs and reference outputs"
	@echo "make bench      eager vs replay, planned vs naive memory (cpu)"
	@echo "make bench-gpu  fused vs unfused AG+GEMM, one-shot vs NCCL all_reduce, replay vs eager (GPUs)"
	@echo "make bench-http wrk on tpserve vs a bare libmicrohttpd baseline (markdown table)"
	@echo "make fuzz       libFuzzer harnesses (request decoder, binary split, safetensors, graph->engine),"
	@echo "                FUZZ_SECONDS each (600), a table of executions, coverage, findings"
	@echo "make soak       SOAK_SECONDS of mixed valid/invalid traffic on a real server, answers checked, RSS"
	@echo "make test-numtext-exhaustive  all 2^32 FP32 patterns through the JSON number writer and reader"
	@echo "make test-math-exhaustive  all 2^32 FP32 patterns through tp_math.h's exp, tanh and erf"
	@echo "make test-libmicrohttpd MHD_SRC=DIR  unit + integration against libmicrohttpd built from DIR (e.g. 1.0.1)"
	@echo "make bench-codec  the JSON tensor codec per request of the example graph, by number spelling"
	@echo "make docker     build the container image tpserve:latest (docker/Dockerfile, needs a Docker engine)"
	@echo "make bench-passes  fused vs unfused MLP at several sizes (cpu)"
	@echo "make bench-ranks   ranks as threads vs one process per rank (cpu)"
	@echo "make bench-ranks-ctx  context switches and CPU per request and per thread, c=1, threads and processes"
	@echo "make bench-import  imported ONNX models: tpserve vs onnxruntime per request"
	@echo "make bench-real    GPT-2, BERT-base, 125M Llama (random weights; needs torch): import, tpserve vs onnxruntime"
	@echo "make bench-generate  GPT-2-small-shaped LM (needs torch): tokens/s, TPOT, TTFT vs onnxruntime and HF generate"
	@echo "make run MODEL=gpt2 WS=2   import tests/onnx/gpt2.onnx (or MODEL=path.onnx) for 2 ranks and serve it"

# Installs missing Debian packages once; re-checked when the stamp is gone.
$(DEPS_OK):
	@mkdir -p $(BUILD)
	@pkg-config --exists $(PKGS) check libcurl && command -v wrk >/dev/null && command -v clang >/dev/null \
	  && $(PYTHON) -c "import numpy" 2>/dev/null || ./scripts/deps.sh
	@touch $@
deps: $(DEPS_OK)

# The engine switches over ops (and their rules) list every case, never
# `default:`, so an op or rule added without its case fails the build.
$(BUILD)/obj/engine/%.o: CFLAGS += -Wswitch-enum
# The cpu kernels' row loops vectorize (tp_math.h's exp, tanh and erf
# among them): under the dynamic cost model (-O2's very-cheap one refuses
# any loop whose trip count is not known to be a multiple of the vector
# width, i.e. every loop over a row), without FP-exception traps (which
# forbid turning a select into a blend) and without errno from sqrtf. Neither
# flag changes a result: nothing here reads FP flags or errno.
# (-fvect-cost-model is GCC's; clang, for the fuzzers, has its own cost model.)
VECT_COST := $(shell $(CC) -fvect-cost-model=dynamic -x c -c /dev/null -o /dev/null 2>/dev/null && \
               echo -fvect-cost-model=dynamic)
$(BUILD)/obj/kernels/cpu/%.o: CFLAGS += $(VECT_COST) -fno-trapping-math -fno-math-errno
# The JSON number writer spells digits on vector lanes (numtext.c,
# spell_digits_block): the same cost model, integers only.
$(BUILD)/obj/server/numtext.o: CFLAGS += $(VECT_COST)

# The cuda device code goes into a shared library.
$(BUILD)/obj/kernels/cuda/%.o: CFLAGS += -fPIC -DTP_CUDA_LIBDIR='"$(LIBDIR)"'

$(BUILD)/obj/util/%.o: INC := $(INC_util)
$(BUILD)/obj/engine/%.o: INC := $(INC_engine)
$(BUILD)/obj/kernels/%.o: INC := $(INC_kernels)
$(BUILD)/obj/server/%.o: INC := $(INC_server)

$(BUILD)/obj/%.o: %.c | $(DEPS_OK)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(INC) $(PKG_CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/obj/%.o: %.cc | $(DEPS_OK)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/libtpserve.a: $(LIB_OBJS)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/tpserve: $(BUILD)/obj/server/main.o $(BUILD)/libtpserve.a | $(CUDA_SO)
	$(CC) $(CFLAGS) -o $@ $< $(TPSERVE_LINK) $(LDLIBS)

$(BUILD)/tests/%: tests/unit/%.c tests/unit/testutil.c tests/unit/testutil.h $(BUILD)/libtpserve.a $(CUDA_DEV_OBJS) \
                  tests/unit/check_main.h | $(DEPS_OK)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(INC_all) $(PKG_CFLAGS) -Itests/unit -o $@ $< tests/unit/testutil.c $(CUDA_LINK) \
	  $(BUILD)/libtpserve.a $(CHECK_LIBS) $(LDLIBS)

ifneq ($(NVCC),)
cuda: $(CUDA_SO)
$(CUDA_SO): $(CUDA_DEV_OBJS)
	$(CC) $(CFLAGS) -shared -o $@ $^ $(CUDA_LIBS) -lm -pthread
$(BUILD)/cuda/%.o: %.cu $(wildcard kernels/common/*.h kernels/cuda/*.h) engine/dtype.h util/status.h
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c $< -o $@
else
cuda:
	@echo "nvcc not found: skipping kernels/cuda (cpu backend only)"
endif

$(GRAPHS): graphs/gen_examples.py | $(DEPS_OK)
	@mkdir -p $(BUILD)/graphs
	$(PYTHON) graphs/gen_examples.py --out $(BUILD)/graphs
	@touch $@
graphs: $(GRAPHS)

# TPSERVE: device tests start `tpserve worker` ranks (one process per GPU).
# The engine suites run again with TPSERVE_CPU_GEMM=openblas: the path every
# weight product takes on a CPU without AVX2 and FMA (kernels/cpu/packed_gemm.h).
OPENBLAS_PATH_TESTS := engine exec generate batcher cpu_ops
unit: $(TEST_BINS) $(BUILD)/tpserve
	@fail=0; for t in $(TEST_BINS); do s=$$(date +%s); \
	  CK_FORK=yes TP_GRAPHS=$(BUILD)/graphs TPSERVE=$(BUILD)/tpserve $$t || fail=1; \
	  echo "   ($${t##*/}: $$(($$(date +%s) - s)) s)"; done; \
	for n in $(OPENBLAS_PATH_TESTS); do echo "TPSERVE_CPU_GEMM=openblas test_$$n:"; \
	  TPSERVE_CPU_GEMM=openblas CK_FORK=yes TP_GRAPHS=$(BUILD)/graphs TPSERVE=$(BUILD)/tpserve \
	  $(BUILD)/tests/test_$$n || fail=1; done; exit $$fail

integration: $(BUILD)/tpserve $(GRAPHS)
	@fail=0; for t in tests/integration/*.sh; do \
	  [ -f "$$t" ] || continue; echo "== $$t"; s=$$(date +%s); \
	  TPSERVE=$(BUILD)/tpserve TP_GRAPHS=$(BUILD)/graphs PYTHON=$(PYTHON) TP_SANITIZED=$(if $(SAN),1,) \
	  sh $$t || fail=1; echo "   ($${t##*/}: $$(($$(date +%s) - s)) s)"; done; exit $$fail

# Build-time guarantees that need a failing compile to show: the op table
# and the layers (include paths per directory).
static-checks:
	@CC="$(CC)" sh tests/static/op_table.sh
	@CC="$(CC)" INC_util="$(INC_util)" INC_engine="$(INC_engine)" INC_kernels="$(INC_kernels)" \
	  INC_server="$(INC_server)" sh tests/static/layers.sh
	@sh tests/static/config_doc.sh
	@CC="$(CC)" sh tests/static/prefetch_kept.sh
	@PYTHON="$(PYTHON)" sh tests/static/doc_links.sh

test: all $(GRAPHS)
	@$(MAKE) --no-print-directory static-checks
	@$(MAKE) --no-print-directory suite
	@$(MAKE) --no-print-directory fuzz-smoke

# What runs the build: make test runs it, make asan runs it again sanitized.
suite: all $(GRAPHS)
	@$(MAKE) --no-print-directory unit
	@$(MAKE) --no-print-directory cuda-double
	@$(MAKE) --no-print-directory integration

# ---- cuda host tests against a double of CUDA/NCCL/cuBLASLt (tests/cuda_double)
# The backend's .c files compiled against the real headers, linked with the
# double instead of libcudart/libnccl/libcublasLt and the .cu kernels:
# a separate test binary, never tpserve. Built whether or not nvcc exists
# (reusing the library objects when they already have TP_HAVE_CUDA);
# skipped with a message when the CUDA headers are missing.
DBL_INC   := $(firstword $(wildcard $(CUDA_HOME)/include/cuda_runtime_api.h /usr/local/cuda/include/cuda_runtime_api.h))
NCCL_H    := $(firstword $(wildcard $(dir $(DBL_INC))nccl.h /usr/local/include/nccl.h /usr/include/nccl.h))
DBL_BIN   := $(BUILD)/tests/test_cuda_host
# The device suite (tests/unit/test_cuda_device.c) against the same double:
# every test and example graph, values only where the double moves bytes.
DBL_DEV_BIN := $(BUILD)/tests/test_cuda_device_dbl
# `tpserve` linked against the double: the server on a cuda backend that fails.
DBL_SRV_BIN := $(BUILD)/tests/tpserve_dbl
ifneq ($(and $(DBL_INC),$(NCCL_H),$(wildcard $(dir $(DBL_INC))cublasLt.h)),)
DBL_CFLAGS := -DTP_HAVE_CUDA -I$(dir $(DBL_INC)) -I$(dir $(NCCL_H))
DBL_SRCS  := $(wildcard tests/cuda_double/*.c)
ifneq ($(NVCC),)
DBL_LIB   := $(LIB_OBJS) $(filter-out $(CU_OBJS),$(CUDA_DEV_OBJS))
else
DBL_LIB   := $(patsubst %.c,$(BUILD)/dbl/%.o,$(LIB_SRCS) $(wildcard kernels/cuda/*.c)) \
             $(patsubst %.cc,$(BUILD)/obj/%.o,$(wildcard server/*.cc))
$(BUILD)/dbl/%.o: %.c | $(DEPS_OK)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(INC_all) $(DBL_CFLAGS) $(PKG_CFLAGS) -MMD -MP -c $< -o $@
-include $(DBL_LIB:.o=.d)
endif
$(DBL_BIN): $(DBL_SRCS) $(wildcard tests/cuda_double/*.h) tests/unit/testutil.c $(DBL_LIB) | $(DEPS_OK)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(INC_all) $(DBL_CFLAGS) $(PKG_CFLAGS) -Itests/unit -Itests/cuda_double -o $@ $(DBL_SRCS) \
	  tests/unit/testutil.c $(DBL_LIB) $(CHECK_LIBS) $(shell pkg-config --libs $(PKGS) 2>/dev/null) -lstdc++ -lm -lrt -pthread $(SAN)
DBL_CORE  := $(filter-out tests/cuda_double/test_cuda_host.c,$(DBL_SRCS))
$(DBL_DEV_BIN): tests/unit/test_cuda_device.c $(DBL_CORE) $(wildcard tests/cuda_double/*.h) tests/unit/testutil.c \
                $(DBL_LIB) | $(DEPS_OK)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DTP_CUDA_DOUBLE $(INC_all) $(DBL_CFLAGS) $(PKG_CFLAGS) -Itests/unit -Itests/cuda_double -o $@ $< \
	  $(DBL_CORE) tests/unit/testutil.c $(DBL_LIB) $(CHECK_LIBS) $(shell pkg-config --libs $(PKGS) 2>/dev/null) \
	  -lstdc++ -lm -lrt -pthread $(SAN)
# tpserve itself against the same double (a test binary, never installed):
# tests/integration/test_cuda_double_server.sh serves with --backend cuda
# and checks readiness 503 and the exit on every injected failure.
$(DBL_SRV_BIN): server/main.c $(DBL_CORE) $(wildcard tests/cuda_double/*.h) $(DBL_LIB) | $(DEPS_OK)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(INC_all) $(DBL_CFLAGS) $(PKG_CFLAGS) -Itests/cuda_double -o $@ $< $(DBL_CORE) $(DBL_LIB) \
	  $(shell pkg-config --libs $(PKGS) 2>/dev/null) -lstdc++ -lm -lrt -pthread $(SAN)
cuda-double: $(DBL_BIN) $(DBL_DEV_BIN) $(DBL_SRV_BIN) $(GRAPHS)
	@fail=0; for t in $(DBL_BIN) $(DBL_DEV_BIN); do \
	  CK_FORK=yes TP_GRAPHS=$(BUILD)/graphs $$t || fail=1; done; \
	  echo "== tests/integration/test_cuda_double_server.sh"; \
	  TPSERVE_DBL=$(DBL_SRV_BIN) TP_GRAPHS=$(BUILD)/graphs PYTHON=$(PYTHON) TP_SANITIZED=$(if $(SAN),1,) \
	  sh tests/integration/test_cuda_double_server.sh || fail=1; exit $$fail
else
cuda-double:
	@echo "cuda double tests skipped: no CUDA headers (cuda_runtime_api.h, cublasLt.h, nccl.h)"
endif

# The suite under ASan + UBSan. Not the static checks (they do not run the
# build) nor fuzz-smoke (its harnesses are always built sanitized, and make
# test has run them).
asan:
	@$(MAKE) --no-print-directory BUILD=build/asan OPT=-O1 \
	  SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" \
	  $(if $(NVCC),NVCC=) suite

# Numeric tests under each OpenBLAS core type (OPENBLAS_CORETYPE): proves the
# suite does not depend on the CPU it runs on. One summary line per core type.
$(BUILD)/tools/blas_core: tests/cpus/blas_core.c | $(DEPS_OK)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(PKG_CFLAGS) -o $@ $< $(LDLIBS)

test-cpus: $(TEST_BINS) $(BUILD)/tpserve $(GRAPHS) $(BUILD)/tools/blas_core
	@BUILD=$(BUILD) TP_GRAPHS=$(BUILD)/graphs TPSERVE=$(BUILD)/tpserve PYTHON=$(PYTHON) sh tests/cpus/test_cpus.sh

$(BUILD)/bench/%: tests/bench/%.c $(BUILD)/libtpserve.a $(CUDA_DEV_OBJS) | $(DEPS_OK)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(INC_all) $(PKG_CFLAGS) -o $@ $< $(CUDA_LINK) $(BUILD)/libtpserve.a $(LDLIBS)

# Benchmarks print tables; they never fail on timings (noisy machines).
bench: $(BUILD)/bench/bench_engine
	$(BUILD)/bench/bench_engine replay

bench-passes: $(BUILD)/bench/bench_engine
	$(BUILD)/bench/bench_engine passes

# Ranks as threads vs one process per rank (the GPU layout) on the cpu backend.
bench-ranks: $(BUILD)/bench/bench_engine $(BUILD)/tpserve
	TPSERVE=$(BUILD)/tpserve $(BUILD)/bench/bench_engine ranks

# BERT-base/GPT-2 GEMMs: OpenBLAS on 1 and every thread, tpserve's small-M
# kernel, and oneDNN with weights packed once when libdnnl-dev is
# installed (only this benchmark links it); a table.
.PHONY: bench-gemm
BENCH_GEMM_DNNL := $(if $(wildcard /usr/include/oneapi/dnnl/dnnl.h),-DTP_BENCH_DNNL)
$(BUILD)/bench/bench_gemm: tests/bench/bench_gemm.c $(BUILD)/libtpserve.a | $(DEPS_OK)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(INC_all) $(PKG_CFLAGS) $(BENCH_GEMM_DNNL) -o $@ $< $(BUILD)/libtpserve.a $(LDLIBS) \
	  $(if $(BENCH_GEMM_DNNL),-ldnnl -lgomp)

bench-gemm: $(BUILD)/bench/bench_gemm
	$(BUILD)/bench/bench_gemm

# One process per GPU; prints one line and exits 0 on a machine without one.
bench-gpu: $(BUILD)/bench/bench_gpu
	$(BUILD)/bench/bench_gpu

# The JSON tensor codec per request of the example graph, by spelling.
bench-codec: $(BUILD)/bench/bench_codec
	$(BUILD)/bench/bench_codec

# Every finite FP32 through the JSON number writer and reader, the writer's
# digits checked against std::to_chars' (a C++ oracle linked in; minutes).
$(BUILD)/bench/numtext_exhaustive: tests/bench/numtext_exhaustive.c tests/bench/numtext_oracle.cc $(BUILD)/libtpserve.a | $(DEPS_OK)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -c tests/bench/numtext_oracle.cc -o $(BUILD)/bench/numtext_oracle.o
	$(CC) $(CFLAGS) $(INC_all) $(PKG_CFLAGS) -o $@ $< $(BUILD)/bench/numtext_oracle.o $(BUILD)/libtpserve.a $(LDLIBS)

test-numtext-exhaustive: $(BUILD)/bench/numtext_exhaustive
	$(BUILD)/bench/numtext_exhaustive

# tp_math.h's exp, tanh and erf on every FP32 pattern against libm in double
# (each function its own forked test; about 7 minutes in all here).
test-math-exhaustive: $(BUILD)/tests/test_math
	CK_TIMEOUT_MULTIPLIER=100 TP_MATH_STEP=1 $(BUILD)/tests/test_math

# The suites against another libmicrohttpd (Debian 13 ships 1.0.1; CI has
# Debian 12's 0.9.75), built from MHD_SRC: scripts/test_libmicrohttpd.sh.
test-libmicrohttpd: $(TEST_BINS) $(BUILD)/tpserve $(GRAPHS)
	@[ -n "$(MHD_SRC)" ] || { echo "set MHD_SRC to a libmicrohttpd source tree"; exit 1; }
	BUILD=$(BUILD) PYTHON=$(PYTHON) sh scripts/test_libmicrohttpd.sh $(MHD_SRC)

bench-http: $(BUILD)/tpserve $(GRAPHS) $(BUILD)/bench/bare_http $(BUILD)/tools/blas_core $(BUILD)/bench/wake_cost
	TPSERVE=$(BUILD)/tpserve BARE_HTTP=$(BUILD)/bench/bare_http TP_GRAPHS=$(BUILD)/graphs \
	  WAKE_COST=$(BUILD)/bench/wake_cost \
	  BLAS_CORE=$(BUILD)/tools/blas_core PYTHON=$(PYTHON) sh tests/load/bench_http.sh

# Per thread and per request at one connection: context switches and CPU,
# ranks as threads and as processes (issue 17: <= 4 and <= 60 us).
bench-ranks-ctx: $(BUILD)/tpserve $(GRAPHS)
	TPSERVE=$(BUILD)/tpserve TP_GRAPHS=$(BUILD)/graphs sh tests/load/rank_ctx.sh

DOCKER_IMAGE ?= tpserve:latest
.PHONY: docker
# Container image (docker/Dockerfile; docker/README.md). Needs a Docker engine.
docker:
	@command -v docker >/dev/null 2>&1 || { echo "make docker: no docker command on PATH (install Docker, or build the image elsewhere: see docker/README.md)" >&2; exit 1; }
	@docker info >/dev/null 2>&1 || { echo "make docker: no Docker engine reachable ('docker info' fails: start dockerd or set DOCKER_HOST); nothing built" >&2; exit 1; }
	docker build -f docker/Dockerfile -t $(DOCKER_IMAGE) .

# ---- coverage-guided fuzzing: libFuzzer harnesses tests/fuzz/fuzz_*.c -------
# The library is rebuilt with clang into build/fuzz (ASan + UBSan + libFuzzer
# coverage); each harness links it. `make fuzz` runs every harness for
# FUZZ_SECONDS, FUZZ_JOBS at a time, and prints a table; `make test` runs
# each for FUZZ_SMOKE_SECONDS so they never rot (tests/fuzz/README.md).
FUZZ_BUILD   := build/fuzz
FUZZ_NAMES   := $(patsubst tests/fuzz/%.c,%,$(wildcard tests/fuzz/fuzz_*.c))
FUZZ_SECONDS ?= 600
FUZZ_SMOKE_SECONDS ?= 3
FUZZ_JOBS    ?= 4
.PHONY: fuzz-build fuzz-smoke soak
FUZZ_SAN     := -fsanitize=address,undefined -fsanitize=fuzzer-no-link -fno-omit-frame-pointer \
                -fno-sanitize-recover=undefined

$(BUILD)/fuzz_%: tests/fuzz/fuzz_%.c $(wildcard tests/fuzz/*.h) $(BUILD)/libtpserve.a
	$(CC) $(CFLAGS) $(INC_all) $(PKG_CFLAGS) -Itests/fuzz -fsanitize=fuzzer -o $@ $< $(BUILD)/libtpserve.a $(LDLIBS)

fuzz-build: $(GRAPHS)
	@command -v clang >/dev/null || ./scripts/deps.sh
	@$(MAKE) --no-print-directory BUILD=$(FUZZ_BUILD) CC=clang CXX=clang++ OPT=-O1 NVCC= SAN="$(FUZZ_SAN)" \
	  $(FUZZ_NAMES:%=$(FUZZ_BUILD)/%)
	@mkdir -p $(FUZZ_BUILD)/seeds/graph
	@cp $(BUILD)/graphs/*_tp2.json $(FUZZ_BUILD)/seeds/graph/
	@$(PYTHON) tests/hostile/hostile_graphs.py write $(FUZZ_BUILD)/hostile >/dev/null
	@cp $(FUZZ_BUILD)/hostile/*.json $(FUZZ_BUILD)/seeds/graph/

FUZZ_HEADER = echo "| harness | seconds | executions | exec/s | cov (edges) | ft (features) | corpus | findings |"; \
	      echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"

fuzz: fuzz-build
	@$(FUZZ_HEADER); printf '%s\n' $(FUZZ_NAMES) | xargs -P $(FUZZ_JOBS) -I{} env FUZZ_BUILD=$(FUZZ_BUILD) \
	  TP_GRAPHS=$(BUILD)/graphs sh tests/fuzz/run_fuzz.sh {} $(FUZZ_SECONDS)

fuzz-smoke: fuzz-build
	@$(FUZZ_HEADER); fail=0; for f in $(FUZZ_NAMES); do FUZZ_BUILD=$(FUZZ_BUILD) TP_GRAPHS=$(BUILD)/graphs \
	  sh tests/fuzz/run_fuzz.sh $$f $(FUZZ_SMOKE_SECONDS) || fail=1; done; exit $$fail

# Mixed valid and invalid traffic against a real server; prints a table.
SOAK_SECONDS ?= 30
SOAK_CONNS   ?= 8
soak: $(BUILD)/tpserve $(GRAPHS)
	TPSERVE=$(BUILD)/tpserve TP_GRAPHS=$(BUILD)/graphs PYTHON=$(PYTHON) SOAK_SECONDS=$(SOAK_SECONDS) \
	  SOAK_CONNS=$(SOAK_CONNS) sh tests/load/soak.sh

# ---- ONNX import (graphs/import_onnx.py; graphs/README.md) -----------------
# $(BUILD)/imported/NAME_tpN.json: tests/onnx/NAME.onnx (or MODEL when it is
# a path to an .onnx file) imported for N tensor-parallel ranks.
# `make run MODEL=gpt2 WS=2` imports a fixture and serves it; IMPORT_ARGS
# go to the importer (IMPORT_ARGS="--plan p.json --dim seq=128
# --sequence-parallel"), its graphs in a directory of their own per
# IMPORT_ARGS, so other arguments import anew.
IMPORTED   := $(BUILD)/imported
WS         ?= 1
IMPORT_DIR := $(IMPORTED)$(if $(strip $(IMPORT_ARGS)),/args-$(shell printf '%s' '$(IMPORT_ARGS)' | cksum | cut -d' ' -f1))
RUN_GRAPH  := $(if $(MODEL),$(IMPORT_DIR)/$(basename $(notdir $(MODEL)))_tp$(WS).json)
ONNX_MODEL  = $(if $(filter %.onnx,$(MODEL)),$(MODEL),tests/onnx/$(patsubst %_tp$(lastword $(subst _tp, ,$*)),%,$(notdir $*)).onnx)
.PHONY: bench-import
# The importer's Python packages, checked once like the Debian ones.
$(BUILD)/.deps-onnx:
	@mkdir -p $(BUILD)
	@$(PYTHON) -c "import onnx, onnxruntime" 2>/dev/null || ./scripts/deps.sh
	@touch $@
$(DEPS_OK): $(BUILD)/.deps-onnx
$(IMPORTED)/%.json: graphs/import_onnx.py $(wildcard graphs/onnx_import/*.py) | $(DEPS_OK)
	@mkdir -p $(dir $@)
	$(PYTHON) graphs/import_onnx.py $(ONNX_MODEL) --world-size $(lastword $(subst _tp, ,$*)) $(IMPORT_ARGS) --out $@

# tpserve (world size 1, 2) vs onnxruntime (same threads) per request; a table.
bench-import: $(BUILD)/tpserve $(BUILD)/tools/blas_core | $(DEPS_OK)
	$(PYTHON) tests/bench/bench_import.py --tpserve $(BUILD)/tpserve --blas-core $(BUILD)/tools/blas_core

# By hand (needs torch, transformers, onnxscript): full-size models exported
# into $(BUILD)/real once (tests/bench/export_real.py), imported at world size
# 1 and 2: import time and memory, tpserve vs onnxruntime, GEMM rate; a table.
# BENCH_REAL_ARGS="--models bert --iters 50" goes to bench_real.py.
.PHONY: bench-real
bench-real: $(BUILD)/tpserve | $(DEPS_OK)
	$(PYTHON) tests/bench/bench_real.py --tpserve $(BUILD)/tpserve --cache $(BUILD)/real $(BENCH_REAL_ARGS)

.PHONY: bench-generate
bench-generate: $(BUILD)/tpserve | $(DEPS_OK)
	$(PYTHON) tests/bench/bench_generate.py --tpserve $(BUILD)/tpserve --cache $(BUILD)/real $(BENCH_GENERATE_ARGS)

run: $(BUILD)/tpserve $(GRAPHS) $(RUN_GRAPH)
	$(BUILD)/tpserve serve --config config/default.json $(if $(RUN_GRAPH),--graph $(RUN_GRAPH))

clean:
	rm -rf build

-include $(LIB_OBJS:.o=.d) $(CUDA_DEV_OBJS:.o=.d) $(BUILD)/obj/server/main.d
