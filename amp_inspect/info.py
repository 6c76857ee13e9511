"""``python -m amp_inspect.info``, the command `make setup` and docs/install.md name: amp_inspect.cli.info."""

from amp_inspect.cli.info import collect, main

__all__ = ["collect", "main"]

if __name__ == "__main__":
    main()
