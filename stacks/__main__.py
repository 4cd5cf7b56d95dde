"""Project CLI. Only `validate` lives on this branch; `plan` and `render` are merged in."""
import sys

from validation.cli import main as validate_main

if __name__ == "__main__":
    if sys.argv[1:2] == ["validate"]:
        sys.exit(validate_main(sys.argv[2:]))
    sys.exit("usage: python -m stacks validate --scenario NAME [--dry-run] ...")
