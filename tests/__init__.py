import sys

# imported before any conftest and test module: bytecode of rkpart and of the assertion-rewritten test modules
# is written (to the gitignored __pycache__/) even where PYTHONDONTWRITEBYTECODE is set; without it every run,
# and every xdist worker, compiles and rewrites ~200 test modules and rkpart again (~8 s of CPU per process,
# half of the fast tier's collection).  Files a test imports from a bundle are imported without it (the
# bundle stays as bundled: tests/board/images.py, tests/bundle/test_bundle.py, the runner's own sampler).
sys.dont_write_bytecode = False
