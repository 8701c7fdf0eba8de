"""One-line protobuf + gRPC C++ code generation with the system protoc (offline)."""

def ckpt_proto_library(name, src, deps = [], grpc = True, visibility = None):
    """Generates <src>.pb.{h,cc} (and .grpc.pb.{h,cc} when grpc) and wraps them in a cc_library.

    Args:
      name: name of the cc_library.
      src: the .proto file in this package.
      deps: other ckpt_proto_library targets whose protos this one imports.
      grpc: whether to generate gRPC service stubs.
      visibility: visibility of the cc_library.
    """
    base = src[:-len(".proto")]
    pkg = native.package_name()
    outs = [base + ".pb.h", base + ".pb.cc"]
    if grpc:
        outs += [base + ".grpc.pb.h", base + ".grpc.pb.cc"]
    cmd = "protoc -I. --cpp_out=$(GENDIR) "
    if grpc:
        cmd += "--grpc_out=$(GENDIR) --plugin=protoc-gen-grpc=$$(which grpc_cpp_plugin) "
    cmd += pkg + "/" + src
    native.genrule(
        name = name + "_gen",
        srcs = [src] + [d + "_srcs" for d in deps],
        outs = outs,
        cmd = cmd,
    )
    native.filegroup(
        name = name + "_srcs",
        srcs = [src],
        visibility = visibility,
    )
    native.cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = [o for o in outs if o.endswith(".h")],
        deps = deps + (["@system//:grpc"] if grpc else ["@system//:protobuf"]),
        visibility = visibility,
    )
