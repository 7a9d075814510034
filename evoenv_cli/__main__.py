"""`python -m evoenv_cli`: the `evoenv` command (what torchrun starts on each rank)."""

from evoenv_cli import main

main()
