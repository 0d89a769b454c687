from pdscale.cli import run

run()
