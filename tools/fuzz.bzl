"""ckpt_fuzz_target: one parser fuzz target, two builds.

A target's source defines `extern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t)`.

* `<name>` is a cc_test built with the normal toolchain (part of `bazel test //...`). It links
  `//tools/fuzz:replay_main`, which feeds every file of the seed corpus to the function and then
  a fixed-seed run of mutations of them (byte flips, truncations, splices), so the corpus and
  every regression input found by fuzzing run on every CI pass, also under --config=asan.
* `<name>_libfuzzer` is the coverage-guided libFuzzer binary (tags "manual", "fuzz"). It needs
  clang: `tools/fuzz.sh` builds it in a separate Bazel output base with `--config=fuzz`
  (libFuzzer + AddressSanitizer + UndefinedBehaviorSanitizer) and runs it for a bounded time.

`corpus_dir` is the seed corpus folder, relative to the package (committed; one input per
file). Inputs that once crashed a parser go there too, named `regression-<what>`.
"""

def ckpt_fuzz_target(name, srcs, corpus_dir, deps = [], size = "small", tags = []):
    corpus = native.glob([corpus_dir + "/**"])
    native.filegroup(
        name = name + "_corpus",
        srcs = corpus,
    )
    native.cc_test(
        name = name,
        size = size,
        srcs = srcs,
        args = ["$(locations :%s_corpus)" % name],
        data = [":" + name + "_corpus"],
        tags = tags + ["asan", "fuzz_replay"],
        deps = deps + ["//tools/fuzz:replay_main"],
    )
    native.cc_binary(
        name = name + "_libfuzzer",
        srcs = srcs,
        # The package-relative corpus folder, read by tools/fuzz.sh through `bazel query`.
        tags = ["manual", "fuzz", "corpus_dir=" + native.package_name() + "/" + corpus_dir],
        linkopts = ["-fsanitize=fuzzer"],
        deps = deps,
    )
