# The two commands of the README, plus a few helpers. Each target sets up first (quick when done).
.PHONY: run test setup lint bench

run: setup
	bash scripts/run.sh

test:
	bash scripts/test.sh

setup:
	bash scripts/setup.sh

lint: setup
	.venv/bin/ruff check . && .venv/bin/mypy

bench: setup
	.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[bench]"
	for b in bench/bench_*.py; do .venv/bin/python "$$b" || exit 1; done
