"""tools/function_length.py on small repositories made by the test: it finds a long function
(single- and multi-line signatures, methods), ignores tests, short functions and class bodies,
and in ci mode fails unless the function has an ALLOWED note."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import function_length  # noqa: E402
import repo_testing  # noqa: E402


def body(n):
    return "".join(f"  x += {i};\n" for i in range(n))


def make_repo(tmp_path, files):
    return repo_testing.make_repo(tmp_path, files, add=True)


FILES = {
    "a/long.cc": ("namespace ckpt {\n\nint Long(int x) {\n" + body(90) + "  return x;\n}\n\n"
                  "int Short(int x) {\n" + body(10) + "  return x;\n}\n\n}  // namespace ckpt\n"),
    "a/multi.cc": ("absl::Status Service::Handle(const Request& request,\n"
                   "                              Response* response) {\n" + body(85) + "}\n"),
    "a/klass.cc": "struct Table {\n" + "".join(f"  int f{i};\n" for i in range(100)) + "};\n",
    "a/long_test.cc": "TEST(A, B) {\n" + body(200) + "}\n",
}


def test_finds_long_functions_with_their_names_and_lengths(tmp_path):
    root = make_repo(tmp_path, FILES)
    found = {(p, name, n) for p in function_length.tracked_sources(root)
             for (p, _, name, n) in function_length.long_functions(p, 80, root)}
    assert found == {("a/long.cc", "Long", 93), ("a/multi.cc", "Service::Handle", 88)}


def test_ci_fails_on_a_long_function_without_a_note_and_passes_with_one(tmp_path, capsys):
    root = make_repo(tmp_path, FILES)
    assert function_length.main(["ci", "--root", root], allowed={}) == 1
    assert "a/long.cc:3: Long is 93 lines" in capsys.readouterr().out
    notes = {"a/long.cc:Long": "a table", "a/multi.cc:Service::Handle": "one switch"}
    assert function_length.main(["ci", "--root", root], allowed=notes) == 0
    assert "(kept: a table)" in capsys.readouterr().out


def test_list_mode_reports_but_never_fails(tmp_path):
    root = make_repo(tmp_path, FILES)
    assert function_length.main(["list", "--root", root], allowed={}) == 0

