import sys

from ortbuild.cli import main

if __name__ == "__main__":  # parallel builds' worker processes import this module again: run nothing then
    sys.exit(main())
