# Environment: a .venv with torch 2.13.0 (CPU) on this machine. On Colab (COLAB_RELEASE_TAG set)
# the system python and its preinstalled CUDA torch are used as they are.
ifdef COLAB_RELEASE_TAG
PY := python3
ENV_STAMP := .colab-env
else
VENV ?= .venv
PY := $(VENV)/bin/python
ENV_STAMP := $(VENV)/.kit-installed
endif
NB ?=
ARGS ?=
JOBS ?=
RELEASES ?= 5.14.1 5.17.0 5.19.0 5.20.0 5.24.0 5.25.0
RELEASES_GPU ?=
# gpu-check's python: the kit's .venv where it exists, else python3 (a stock GPU image: CUDA torch, transformers,
# pandas, matplotlib installed, no jupyter, no network). Another python whose torch imports runs without `env`.
GPU_PY ?= $(if $(wildcard $(PY)),$(PY),python3)
# gpu-wheels: both releases' transformers wheels, for a GPU machine without network (5.17.0's in case its image has
# another release). 5.20.0's requirements differ from 5.17.0's only in huggingface-hub<3.0,>=1.31.0, which the lent
# GPU machine's huggingface-hub 1.33.0 meets, so the transformers wheels alone are enough there.
GPU_WHEELS ?= transformers==5.17.0 transformers==5.20.0
# gpu-check: seconds per step (one release's arms, one flash step), the whole check's budget (0: none), its one folder
GPU_STEP_TIMEOUT ?= 200
GPU_BUDGET ?= 0
GPU_OUT ?=
CLAIM ?=
KEY ?=
GOOD ?=
BAD ?=

.PHONY: help env share run-all run test test-fast generate report matrix bisect gpu-plan gpu-check gpu-wheels mutants upstream-tests bench hf-tests clean
.DEFAULT_GOAL := help

help: ## this list: every target with one line
	@awk -F ':.*## ' '/^[a-z][a-z-]*:.*## / {printf "  %-12s %s\n", $$1, $$2}' $(firstword $(MAKEFILE_LIST))

env: $(ENV_STAMP) ## set up .venv (torch 2.13.0 CPU + requirements.txt); other targets do it on first use

$(ENV_STAMP): requirements.txt requirements-runtime.txt requirements-nodeps.txt requirements-tests.txt pyproject.toml packages/kvresume/pyproject.toml
ifndef COLAB_RELEASE_TAG
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0
endif
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps -e packages/kvresume -e .
ifndef COLAB_RELEASE_TAG
	$(PY) -m pip install -q -r requirements-tests.txt
	$(PY) -m pip install -q --no-deps -r requirements-nodeps.txt
endif
	touch $@

# share: the paste, the one documented way: every notebook on the pinned release (requirements-runtime.txt) as one
# recorded run, then on the newest release the package index lists (resolved now with pip; offline, the newest the
# kit knows, and SUMMARY.md says so) through `make matrix`'s machinery, then SUMMARY.md, html/ and share.zip.
share: env ## the paste: every notebook on the pinned and on the newest release, then outputs/SUMMARY.md + share.zip
	$(PY) -m helpers.pipeline.run share $(if $(JOBS),--jobs $(JOBS))

# run-all: every notebook (NB="01 02" restricts it), in parallel, as one recorded run (outputs/run.json);
# outputs of earlier runs are removed first. Ctrl-C stops it within seconds and the summary says so.
run-all: env ## every notebook as one recorded run (NB="01 02" restricts it, JOBS=, ARGS="-p NAME VALUE")
	$(PY) -m helpers.pipeline.run run-all $(if $(JOBS),--jobs $(JOBS)) $(if $(NB),--notebooks $(NB)) $(ARGS)

# run: one notebook as its own recorded run; its earlier outputs are replaced, SUMMARY.md is refreshed
# (other notebooks' results appear there as from an earlier run).
run: env ## one notebook as its own recorded run: NB=02 [ARGS="-p NAME VALUE ..."]
	@test -n "$(NB)" || (echo "usage: make run NB=02 [ARGS='-p model_id ...']" && exit 2)
	$(PY) -m helpers.pipeline.run run $(NB) $(ARGS)

# report: rebuild outputs/html/, outputs/SUMMARY.md and share.zip from what is on disk.
report: env ## rebuild outputs/SUMMARY.md, outputs/html/ and outputs/share.zip from what is on disk
	$(PY) -m helpers.pipeline.run report

# matrix: every notebook (NB="01" restricts it) on each release in RELEASES, each in .venv-tf/<release>
# sharing this environment's torch; results in outputs/matrix/<release>/, table in outputs/matrix.md.
matrix: env ## every notebook (NB= restricts) on each release in RELEASES; outputs/matrix.md
	$(PY) -m helpers.pipeline.run matrix --releases $(RELEASES) $(if $(NB),--notebooks $(NB)) $(if $(JOBS),--jobs $(JOBS))

# bisect: the first release where one notebook's claim verdict (CLAIM=) or recorded value (KEY=) differs from
# GOOD's (default 5.14.1; BAD default 5.25.0), by halving the releases pip lists between them, with the
# source diff of the notebook's relevant transformers functions: outputs/bisect/<nb>-<claim or key>.md/.json.
bisect: env ## the first release where NB's CLAIM= verdict or KEY= value differs from GOOD's (BAD=), with the source diff
	$(PY) -m helpers.pipeline.bisect --notebook "$(NB)" $(if $(CLAIM),--claim $(CLAIM)) $(if $(KEY),--key $(KEY)) $(if $(GOOD),--good $(GOOD)) $(if $(BAD),--bad $(BAD))

# gpu-check: the CUDA-only claims on a machine with a GPU (RELEASES_GPU="5.17.0 5.24.0" to choose releases), with
# python -m helpers.offload.gpu (no jupyter). GPU_PY (other than the kit's .venv) runs as it is when its torch
# imports; else the kit's .venv is built first, as for every other target. helpers imports from this checkout.
GPU_CHECK_ARGS = -m helpers.pipeline.tools.gpu_check $(if $(RELEASES_GPU),--releases $(RELEASES_GPU)) \
	--timeout $(GPU_STEP_TIMEOUT) --budget $(GPU_BUDGET) $(if $(GPU_OUT),--out $(GPU_OUT))
GPU_PLAN_ARGS = -m helpers.pipeline.tools.gpu_plan $(if $(RELEASES_GPU),--releases $(RELEASES_GPU)) --timeout $(GPU_STEP_TIMEOUT)
# gpu-plan: what gpu-check would run, without CUDA (releases, layouts, arms and their lag, pool poisoning, timeout, minutes).
# $(call gpu_py,ARGS,ECHO): GPU_PY (other than the kit's .venv) runs ARGS as it is when its torch imports (ECHO=1
# prints the command first); else the kit's .venv is built first.
gpu_py = if [ "$(GPU_PY)" != "$(PY)" ] && $(GPU_PY) -c "import torch" 2>/dev/null; then \
		$(if $(2),echo "PYTHONPATH=$(CURDIR) $(GPU_PY) $(1)";) \
		PYTHONPATH="$(CURDIR)" $(GPU_PY) $(1); \
	else \
		$(MAKE) --no-print-directory env && $(PY) $(1); \
	fi

gpu-plan: ## what gpu-check would run, printed without CUDA: releases, layouts, arms and lag, poisoning, timeout, minutes
	@$(call gpu_py,$(GPU_PLAN_ARGS))

gpu-check: ## notebook 05's CUDA-only claims on a GPU machine (RELEASES_GPU=, GPU_PY=, GPU_OUT=, GPU_STEP_TIMEOUT=, GPU_BUDGET=); refuses in one line without CUDA
	@$(call gpu_py,$(GPU_CHECK_ARGS),1)

# gpu-wheels: the wheels gpu-check's second release installs from on a machine without network, into wheels/
# (GPU_WHEELS= to add others); ensure_env installs from wheels/ alone (--no-index) when it holds the release.
gpu-wheels: ## download both releases' transformers wheels gpu-check installs offline into wheels/ (GPU_WHEELS=)
	for w in $(GPU_WHEELS); do $(GPU_PY) -m pip download -q --no-deps --only-binary=:all: -d wheels/ $$w || exit 1; done
	@ls -l wheels/

test: env ## the whole test suite (CI's command): unit, kill and end-to-end notebook tests
	$(PY) -m pytest -q -n 2 --dist loadfile tests packages/kvresume/tests

test-fast: env ## the unit and kill tests that need no notebook run (pytest -m "not e2e"): run it after every edit
	$(PY) -m pytest -q -n 2 --dist loadfile -m "not e2e" tests packages/kvresume/tests

# generate: every committed file the kit renders from its declarations (docs/adding-a-finding.md): each notebook's
# Colab cell, README's notebook table and badges, docs/parameters.md, tests/golden/decision_outputs.json.
generate: env ## rewrite every generated file: the Colab cells, README's table, docs/parameters.md, the golden decisions
	$(PY) -m helpers.pipeline.tools.colab --write notebooks/*.ipynb README.md docs/parameters.md
	KVKIT_UPDATE_GOLDEN=1 $(PY) -m pytest -q -p no:cacheprovider tests/test_decisions.py -k golden

# mutants: mutation testing (mutmut) of the decision functions listed in helpers/pipeline/tools/mutant_scope.py SCOPE, on the
# fast tests only; prints killed/total per module and every survivor, fails below 90% killed in any module.
# MODULES="compare tree" restricts it; not part of `make test` (see README for its time here).
MODULES ?=
mutants: env ## mutation testing of the decision functions (MODULES= restricts it); not part of make test
	$(PY) -m helpers.pipeline.tools.mutants $(MODULES)

# upstream-tests: outputs/upstream/test_resume_contract.py, a standalone pytest file (torch, transformers, pytest only)
# stating the resume contract (documented usage equals the full computation; misuse raises under the guard, xfail for
# plain generate()), nothing measured; run with pytest on the installed release and on each of UPSTREAM_RELEASES.
UPSTREAM_RELEASES ?=
upstream-tests: env ## write outputs/upstream/test_resume_contract.py (standalone) and run it (UPSTREAM_RELEASES= adds releases)
	$(PY) -m helpers.proposal.upstream $(if $(UPSTREAM_RELEASES),--releases $(UPSTREAM_RELEASES))

# bench: what kvresume.track costs per decoded token, tracked vs untracked (the tiny model and a ~64M random Qwen3,
# 256 new tokens): ms (median of interleaved pairs' ratios, 101/11 pairs, with its 95% interval) and instructions under
# valgrind's cachegrind (apt-get install valgrind; the same count whatever the load), and one resume()'s extra memory;
# into docs/performance.md ("Tracking cost"). BENCH_ARGS="--runs 9 --new 128 --no-count --device cuda" changes it.
# Then time to first token per turn of 3 8-turn chats through plain `transformers serve` and `kvresume serve`, new
# chats both servers miss, and a miss timed in-process (helpers.pipeline.tools.serve_bench; 4 minutes of the 14 on a
# loaded 2-core CPU), into its "Serving" section.
BENCH_ARGS ?=
bench: env ## tracking cost per token, one resume()'s memory, first-token time through the real servers: docs/performance.md
	$(PY) -m helpers.pipeline.tools.bench --write $(BENCH_ARGS)
	$(PY) -m helpers.pipeline.tools.serve_bench --write

clean: ## remove everything a run left in outputs/
	rm -rf outputs/notebooks outputs/resume_state outputs/results outputs/figures outputs/html outputs/matrix outputs/matrix.md outputs/bisect outputs/SUMMARY.md outputs/timings.json outputs/run.json outputs/upstream

# hf-tests: transformers' own tests plain and with kvresume tracking + guard; summary in outputs/hf-tests/summary.json
HF_TESTS ?= outputs/hf-tests/tests
HF_OUT := outputs/hf-tests
hf-tests: env ## transformers' own tests with every model tracked and the resume guard on generate() (docs/hf-tests.md)
	mkdir -p $(HF_OUT)
	$(PY) -m pip install -q -r requirements-hftests.txt
	-HF_HUB_OFFLINE=1 PYTHONPATH=$(CURDIR):$(CURDIR)/packages/kvresume timeout 5400 $(PY) -m pytest -q -p no:xdist -p no:cacheprovider -o timeout=120 -p helpers.pipeline.tools.hftests --hf-json=$(HF_OUT)/plain.json $(HF_TESTS)
	-HF_HUB_OFFLINE=1 PYTHONPATH=$(CURDIR):$(CURDIR)/packages/kvresume timeout 5400 $(PY) -m pytest -q -p no:xdist -p no:cacheprovider -o timeout=120 -p helpers.pipeline.tools.hftests --hf-track --hf-json=$(HF_OUT)/tracked.json $(HF_TESTS)
	$(PY) -m helpers.pipeline.tools.hftests $(HF_OUT)/plain.json $(HF_OUT)/tracked.json $(HF_OUT)/summary.json
