"""C++ messages (no services) from one .proto file, with Debian's protoc."""

def cc_message_proto(name, proto, imports = [], deps = []):
    """`name`: a cc_library of the messages in `proto` (foo.proto gives
    foo.pb.h). `imports`: the .proto files it imports; `deps`: their
    cc_libraries."""
    stem = proto[:-len(".proto")]
    native.genrule(
        name = name + "_gen",
        srcs = [proto] + imports,
        outs = [stem + ".pb.h", stem + ".pb.cc"],
        cmd = ("/usr/bin/protoc --proto_path=$$(dirname $(location {p})) " +
               "--cpp_out=$(RULEDIR) $(location {p})").format(p = proto),
    )
    native.cc_library(
        name = name,
        srcs = [stem + ".pb.cc"],
        hdrs = [stem + ".pb.h"],
        copts = ["-Wno-unused-parameter"],
        deps = deps + ["//:grpc"],
    )
