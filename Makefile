# Fresh-machine entry points. Each target sets up .venv itself (scripts/bootstrap.sh).
.PHONY: venv test test-fast smoke

venv:
	bash scripts/bootstrap.sh

# The full test suite (what CI runs).
test: venv
	.venv/bin/python -m pytest -q --durations=15

# Everything but the slow end-to-end tests.
test-fast: venv
	.venv/bin/python -m pytest -q -m "not slow"

# The main job on its embedded default: the WMT'14 En-Fr workflow, smoke preset (demo corpus, CPU).
smoke: venv
	.venv/bin/python workflows/wmt14_en_fr.py --preset smoke
