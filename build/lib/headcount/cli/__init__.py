"""The command line: a thin typer app over the layers below (nothing imports this package).

Holds the console script's entry (:mod:`.entry`: Ctrl-C handled before the heavy imports, so this
``__init__`` imports nothing), the typer app (:mod:`.app`), one module per command area
(:mod:`.commands`) and the functions behind the commands that are no single module's verb
(:mod:`.api`).

May import: every other package.
"""
