"""ckpt_py_test: a pytest file run by the project's Python environment (.venv).

    ckpt_py_test(
        name = "megatron_oracle_test",
        src = "megatron_oracle_test.py",
        binaries = {"CKPTCTL": "//tools:ckptctl"},
    )

Runs `.venv/bin/python -m pytest <src>` through tools/py_test_runner.sh, with each binary's
runfiles path in the environment variable named by its key, the workspace root on PYTHONPATH,
and pytest's JUnit XML written where Bazel expects it (so every test function counts).
"""

def ckpt_py_test(name, src, binaries = {}, data = [], size = "medium", tags = [], **kwargs):
    args = ["$(location %s)" % src]
    for env, label in binaries.items():
        args.append("%s=$(location %s)" % (env, label))
    native.sh_test(
        name = name,
        size = size,
        srcs = ["//tools:py_test_runner.sh"],
        args = args,
        data = [src, "@python_venv//:pyvenv.cfg"] + list(binaries.values()) + data,
        tags = tags + ["python"],
        **kwargs
    )
