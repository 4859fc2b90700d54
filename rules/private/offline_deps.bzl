"""Offline stand-ins for repositories that Bazel 4.2.3's built-in WORKSPACE
suffix would otherwise download (GitHub / mirror.bazel.build are unreachable).

`fastci_repositories()` calls `offline_deps()` before the suffix runs, so the
suffix's `maybe(http_archive, ...)` calls become no-ops. Learned from
/work/shared/bazel-offline (FACTS.md); measured facts in docs/BAZEL.md.
"""

# --- @rules_cc -------------------------------------------------------------
# Needed by @local_config_cc (every py_test resolves the C++ toolchain).
# Debian's bazel-rules-cc 0.0.4 is too new for Bazel 4.2.3
# (loads `use_cpp_toolchain`), so generate thin wrappers over native rules.

_CC_DEFS = '''
_TAG = "__CC_RULES_MIGRATION_DO_NOT_USE_WILL_BREAK__"

def _t(attrs):
    attrs["tags"] = (attrs.get("tags") or []) + [_TAG]
    return attrs

def cc_binary(**attrs):
    native.cc_binary(**_t(attrs))

def cc_test(**attrs):
    native.cc_test(**_t(attrs))

def cc_library(**attrs):
    native.cc_library(**_t(attrs))

def cc_import(**attrs):
    native.cc_import(**_t(attrs))

def cc_proto_library(**attrs):
    native.cc_proto_library(**_t(attrs))

def fdo_prefetch_hints(**attrs):
    native.fdo_prefetch_hints(**_t(attrs))

def fdo_profile(**attrs):
    native.fdo_profile(**_t(attrs))

def cc_toolchain(**attrs):
    native.cc_toolchain(**_t(attrs))

def cc_toolchain_suite(**attrs):
    native.cc_toolchain_suite(**_t(attrs))

def objc_library(**attrs):
    native.objc_library(**_t(attrs))

def objc_import(**attrs):
    native.objc_import(**_t(attrs))
'''

_CC_BUILD = '''
package(default_visibility = ["//visibility:public"])

alias(
    name = "toolchain_type",
    actual = "@bazel_tools//tools/cpp:toolchain_type",
)
'''

def _stub_rules_cc_impl(rctx):
    rctx.file("WORKSPACE", 'workspace(name = "rules_cc")\n')
    rctx.file("BUILD.bazel", "")
    rctx.file("cc/BUILD.bazel", _CC_BUILD)
    rctx.file("cc/defs.bzl", _CC_DEFS)

stub_rules_cc = repository_rule(
    implementation = _stub_rules_cc_impl,
    doc = "@rules_cc as thin wrappers over the native cc rules (Debian's is too new for 4.2.3).",
)

# --- @remote_coverage_tools -------------------------------------------------
# An implicit dependency of every *_test rule in Bazel 4.2
# (@bazel_tools//tools/test:coverage_report_generator aliases into it).

_COV_BUILD = '''
package(default_visibility = ["//visibility:public"])

sh_binary(
    name = "coverage_report_generator",
    srcs = ["report_generator.sh"],
)

sh_binary(
    name = "lcov_merger",
    srcs = ["lcov_merger.sh"],
)
'''

# Minimal stand-in for Bazel's Java CoverageOutputGenerator: concatenates every
# *.dat lcov file that the test wrote under --coverage_dir into --output_file.
_LCOV_MERGER = """#!/bin/sh
for a in "$@"; do
  case "$a" in
    --coverage_dir=*) dir="${a#*=}" ;;
    --output_file=*) out="${a#*=}" ;;
  esac
done
: > "$out"
find "$dir" -name '*.dat' -type f | sort | while read -r f; do cat "$f" >> "$out"; done
exit 0
"""

# Stand-in for the combined report (--combined_report=lcov): concatenates the
# per-test coverage.dat files listed in --reports_file into --output_file.
_REPORT_GENERATOR = """#!/bin/sh
for a in "$@"; do
  case "$a" in
    --reports_file=*) list="${a#*=}" ;;
    --output_file=*) out="${a#*=}" ;;
  esac
done
: > "$out"
while read -r f; do [ -f "$f" ] && cat "$f" >> "$out"; done < "$list"
exit 0
"""

def _stub_remote_coverage_tools_impl(rctx):
    rctx.file("WORKSPACE", 'workspace(name = "remote_coverage_tools")\n')
    rctx.file("lcov_merger.sh", _LCOV_MERGER, executable = True)
    rctx.file("report_generator.sh", _REPORT_GENERATOR, executable = True)
    rctx.file("BUILD.bazel", _COV_BUILD)

stub_remote_coverage_tools = repository_rule(
    implementation = _stub_remote_coverage_tools_impl,
    doc = "@remote_coverage_tools: an implicit dependency of every test; lcov files are concatenated.",
)

def offline_deps():
    """Defines @rules_cc, @remote_coverage_tools and @rules_java without network access."""
    if not native.existing_rule("rules_cc"):
        stub_rules_cc(name = "rules_cc")
    if not native.existing_rule("remote_coverage_tools"):
        stub_remote_coverage_tools(name = "remote_coverage_tools")
    if native.existing_rule("rules_java"):
        return

    # @bazel_tools//tools/jdk:all (registered by default) loads @rules_java.
    # Debian package bazel-rules-java (4.0.0) works with Bazel 4.2.3.
    native.local_repository(
        name = "rules_java",
        path = "/usr/share/bazel/rules/java",
    )
