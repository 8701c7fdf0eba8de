"""Link flags that put the system's gRPC, protobuf, OpenSSL and Abseil into a binary statically.

ckptctl is a short-lived command: dynamically it loads 75 shared libraries and resolves ~16,000
symbols before main (~10 ms of CPU, most of `ckptctl plan distribute`'s start; issue 16's
target for that command is 93 ms end to end). These flags, in the binary's own linkopts, name
the Debian -dev packages' archives (installed by tools/install_deps.sh) ahead of the -l flags
that third_party/system.BUILD gives every target, and --as-needed then drops the shared
libraries nothing is left to resolve from; glibc, libstdc++, libxxhash (whose .a lacks the
x86 dispatch functions) and liburing stay shared. Every archive listed must exist: the -dev
packages install_deps.sh installs (libgrpc++-dev, libssl-dev, libabsl-dev, libre2-dev and their
dependencies libc-ares-dev, zlib1g-dev) provide them on Debian x86_64; a missing one fails the link.
"""

_LIB_DIR = "/usr/lib/x86_64-linux-gnu/"

# In link order (dependents first), as third_party/system.BUILD lists them.
_ARCHIVES = [
    "grpc++",
    "grpc",
    "address_sorting",
    "re2",
    "upb",
    "cares",
    "gpr",
    "ssl",
    "crypto",
    "z",
    "protobuf",
    "absl_flags_parse",
    "absl_flags_usage",
    "absl_flags_usage_internal",
    "absl_flags_internal",
    "absl_flags_marshalling",
    "absl_flags_reflection",
    "absl_flags_private_handle_accessor",
    "absl_flags_commandlineflag",
    "absl_flags_commandlineflag_internal",
    "absl_flags_config",
    "absl_flags_program_name",
    "absl_random_distributions",
    "absl_random_seed_sequences",
    "absl_random_internal_pool_urbg",
    "absl_random_internal_randen",
    "absl_random_internal_randen_hwaes",
    "absl_random_internal_randen_hwaes_impl",
    "absl_random_internal_randen_slow",
    "absl_random_internal_platform",
    "absl_random_internal_seed_material",
    "absl_random_seed_gen_exception",
    "absl_statusor",
    "absl_status",
    "absl_raw_hash_set",
    "absl_hashtablez_sampler",
    "absl_hash",
    "absl_city",
    "absl_low_level_hash",
    "absl_cord",
    "absl_cordz_info",
    "absl_cord_internal",
    "absl_cordz_functions",
    "absl_exponential_biased",
    "absl_cordz_handle",
    "absl_bad_optional_access",
    "absl_bad_variant_access",
    "absl_strerror",
    "absl_str_format_internal",
    "absl_synchronization",
    "absl_graphcycles_internal",
    "absl_stacktrace",
    "absl_symbolize",
    "absl_debugging_internal",
    "absl_demangle_internal",
    "absl_malloc_internal",
    "absl_time",
    "absl_civil_time",
    "absl_time_zone",
    "absl_strings",
    "absl_strings_internal",
    "absl_base",
    "absl_spinlock_wait",
    "absl_int128",
    "absl_throw_delegate",
    "absl_raw_logging_internal",
    "absl_log_severity",
]

STATIC_SYSTEM_LINKOPTS = (
    ["-Wl,--as-needed", "-Wl,--start-group"] +
    [_LIB_DIR + "lib" + name + ".a" for name in _ARCHIVES] +
    ["-Wl,--end-group"]
)
