"""A program sent to the pool runs as `python main.py` in a fresh directory would (issue 24).

Each ordinary program below runs twice: through the pool's `/run_code` (SandboxFusion's dialect,
with its `files` and `stdin`) and as a real `python main.py` subprocess of the same interpreter,
in a fresh temporary directory holding `main.py` and the same files, with the environment the
pool's workers give their children. stdout, stderr and the exit code must be equal. Only what
must differ is normalised (`normalise`): the program's directory (the pool's is
`<workdir>/<lease>/s<slot>-<ns>`, the reference's a temporary directory) becomes `<dir>`, and the
seconds unittest reports ("Ran 2 tests in 0.001s") become `<t>`.

Both modes run: as root (children get a uid of their own) and as in the pod (the server is
`nobody`, children share its uid). Both servers run on Debian's Python 3.11 (conftest.debian_venv),
as the image's interpreter is readable by every uid; the pool as root on pyenv's interpreter under
a 0700 /root could import only preloaded modules and show no source lines of library frames."""

from __future__ import annotations

import base64
import os
import re
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from textwrap import dedent

import pytest
from harness.sandbox_process import SandboxProcess
from tool_sandbox.sandbox.pool import worker_environment


@dataclass(frozen=True)
class Program:
    code: str
    files: dict[str, str] = field(default_factory=dict)
    stdin: str = ""
    fetch: tuple[str, ...] = ()  # files whose contents after the run are compared too


PROGRAMS = {
    # sys.modules["__main__"] was the worker's module: unittest.main() ran 0 tests and exited 0
    "unittest_failing_suite": Program(
        dedent(
            """\
            import unittest

            def add(a, b):
                return a - b

            class TestAdd(unittest.TestCase):
                def test_zero(self):
                    self.assertEqual(add(0, 0), 0)

                def test_two(self):
                    self.assertEqual(add(1, 1), 2)

            if __name__ == '__main__':
                unittest.main()
            """
        ),
    ),
    "unittest_passing_suite": Program(
        dedent(
            """\
            import unittest

            class TestSorted(unittest.TestCase):
                def test_sorted(self):
                    self.assertEqual(sorted([3, 1, 2]), [1, 2, 3])

                def test_raises(self):
                    with self.assertRaises(ZeroDivisionError):
                        1 / 0

            unittest.main(verbosity=2)
            """
        ),
    ),
    "doctest_testmod": Program(
        dedent(
            """\
            def square(x):
                '''
                >>> square(3)
                9
                >>> square(-2)
                5
                '''
                return x * x

            if __name__ == '__main__':
                import doctest
                print(doctest.testmod())
            """
        ),
    ),
    "main_module_identity": Program(
        dedent(
            """\
            import sys, __main__
            print(sys.modules['__main__'] is __main__, __main__.__dict__ is globals())
            print(__name__, __package__, __spec__, __doc__, __cached__)
            print(sorted(globals()))
            print(type(__loader__).__name__, __loader__.name, __loader__.path == __file__)
            print(sys.argv, sys.orig_argv[1:], __file__)
            """
        ),
    ),
    "pickle_own_classes": Program(
        dedent(
            """\
            import pickle
            from dataclasses import dataclass

            @dataclass
            class Point:
                x: int
                y: int

            class Box:
                def __init__(self, items):
                    self.items = items

            data = pickle.dumps([Point(1, 2), Box([Point(3, 4)])])
            back = pickle.loads(data)
            print(back[0], back[1].items, type(back[1]).__qualname__)
            """
        ),
    ),
    "introspection_of_main": Program(
        dedent(
            """\
            from __future__ import annotations
            import dataclasses, inspect, timeit, typing

            @dataclasses.dataclass
            class Config:
                name: str
                count: typing.ClassVar[int] = 0
                tags: list[str] = dataclasses.field(default_factory=list)

            def f(x: int) -> int:
                return x + 1

            print([fl.name for fl in dataclasses.fields(Config)])
            print(typing.get_type_hints(f))
            print(inspect.getsource(Config).splitlines()[1])
            print(timeit.timeit('f(1)', setup='from __main__ import f', number=10) >= 0)
            """
        ),
    ),
    # sys.path[0] was the server's directory; main.py was not on disk
    "imports_of_sibling_files": Program(
        dedent(
            """\
            import os, sys
            import helper
            from pkg.inner import triple
            print(helper.double(4), triple(5), helper.__file__)
            print(sys.path[0] == os.getcwd(), os.path.exists('main.py'))
            print(open(__file__).read().splitlines()[0])
            helper.fail()
            """
        ),
        files={
            "helper.py": dedent(
                """\
                def double(x):
                    return 2 * x

                def fail():
                    raise RuntimeError('from helper')
                """
            ),
            "pkg/__init__.py": "",
            "pkg/inner.py": dedent(
                """\
                def triple(x):
                    return 3 * x
                """
            ),
        },
    ),
    # as root the directories made for `files` belonged to root, not to the program
    "writes_next_to_its_files": Program(
        dedent(
            """\
            import os
            with open('data/out.txt', 'w') as f:
                f.write(open('data/deep/in.txt').read().upper())
            os.mkdir('data/new')
            print(open('data/out.txt').read(), sorted(os.listdir('data')))
            """
        ),
        files={
            "data/deep/in.txt": dedent(
                """\
                hello
                """
            ),
        },
    ),
    # RLIMIT_NPROC 64 per uid as root; multiprocessing's locks needed /dev/shm
    "threads_and_thread_pools": Program(
        dedent(
            """\
            import threading, concurrent.futures
            from multiprocessing.pool import ThreadPool
            import multiprocessing
            results = []
            lock = threading.Lock()
            def work(i):
                with lock:
                    results.append(i)
            threads = [threading.Thread(target=work, args=(i,)) for i in range(100)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            print(len(results), sum(results))
            with ThreadPool(4) as pool:
                print(pool.map(lambda x: x * x, range(8)))
            with concurrent.futures.ThreadPoolExecutor(4) as ex:
                print(list(ex.map(abs, [-1, -2])))
            q = multiprocessing.Queue()
            q.put('through a queue')
            print(q.get(timeout=5))
            lk = multiprocessing.RLock()
            with lk:
                with lk:
                    print('reentrant')
            sem = multiprocessing.BoundedSemaphore(1)
            sem.acquire()
            sem.release()
            try:
                sem.release()
            except ValueError as e:
                print('ValueError', e)
            late = threading.Thread(target=lambda: print('non-daemon thread finishes'))
            late.start()
            """
        ),
    ),
    "atexit_handlers": Program(
        dedent(
            """\
            import atexit, sys, weakref
            def first():
                print('first registered, runs last')
            def second(x):
                print('second', x)
                sys.stdout.flush()
                raise ValueError('in atexit')
            atexit.register(first)
            atexit.register(second, 42)
            class Holder:
                pass
            kept = Holder()
            weakref.finalize(kept, print, 'finalizer of a live object, at exit')
            print('main done')
            sys.exit(3)
            """
        ),
    ),
    "deep_recursion": Program(
        dedent(
            """\
            import sys
            def depth(n=1):
                try:
                    return depth(n + 1)
                except RecursionError:
                    return n
            print(sys.getrecursionlimit(), depth())
            sys.setrecursionlimit(5000)
            print(depth())
            sys.setrecursionlimit(1000)
            def down(n):
                return down(n + 1)
            down(0)
            """
        ),
    ),
    "exit_codes": Program(
        dedent(
            """\
            import sys
            print('before')
            sys.exit('bad input: expected an integer')
            """
        ),
    ),
    "exit_code_number": Program(
        dedent(
            """\
            raise SystemExit(300)
            """
        ),
    ),
    "keyboard_interrupt": Program(
        dedent(
            """\
            import os, signal
            print('about to interrupt')
            os.kill(os.getpid(), signal.SIGINT)
            print('not reached')
            """
        ),
    ),
    # os._exit loses what a real interpreter has not flushed: stdout to a pipe is block-buffered
    "os_exit_unflushed": Program(
        dedent(
            """\
            import os, sys
            print('lost')
            sys.stderr.write('kept\\n')
            os._exit(4)
            """
        ),
    ),
    "os_exit_flushed": Program(
        dedent(
            """\
            import os, sys
            print('kept')
            sys.stdout.flush()
            os._exit(5)
            """
        ),
    ),
    # C stdio: flushed at a normal exit, lost at os._exit
    "c_stdio_at_exit": Program(
        dedent(
            """\
            import ctypes
            ctypes.CDLL(None).printf(b'from C %d\\n', 7)
            print('python')
            """
        ),
    ),
    "c_stdio_at_os_exit": Program(
        dedent(
            """\
            import ctypes, os
            ctypes.CDLL(None).printf(b'lost %d\\n', 7)
            os._exit(0)
            """
        ),
    ),
    # the error printer was the traceback module's: carets and trailing spaces differed
    "traceback_carets": Program(  # explicit: trailing spaces on purpose
        "def f(a, b):\n"
        "    return a[0]    +   b['x']   \n"
        "\n"
        "values = {'y': 1}\n"
        "def g():\n"
        "    return f([1], values)  \n"
        "g()\n"
    ),
    "traceback_chained": Program(
        dedent(
            """\
            import json
            class ParseFailure(Exception):
                pass
            def parse(text):
                try:
                    return json.loads(text)
                except ValueError as exc:
                    raise ParseFailure(f'cannot parse {text!r}') from exc
            try:
                parse('{bad')
            except ParseFailure:
                1 / 0
            """
        ),
    ),
    "syntax_error": Program(
        dedent(
            """\
            print('never')
            def f(:
                pass
            """
        ),
    ),
    "warnings_and_stderr": Program(
        dedent(
            """\
            import asyncio, logging, sys, warnings
            warnings.warn('careful')
            warnings.warn('old', DeprecationWarning)
            print('to stderr', file=sys.stderr)
            logging.basicConfig(format='%(levelname)s %(name)s: %(message)s')
            logging.getLogger('app').warning('logged')
            print(asyncio.run(asyncio.sleep(0, 'from asyncio')))
            print('\\u00e9t\\u00e9 \\u2713')
            """
        ),
    ),
    # compile() inherited the sandbox's own `from __future__ import annotations`
    "annotations_evaluated": Program(
        dedent(
            """\
            import dataclasses
            def f(x: int, y: 'str') -> list[int]:
                return [x]
            print(f.__annotations__)
            @dataclasses.dataclass
            class P:
                x: int = 0
            print(P.__annotations__)
            """
        ),
    ),
    # the interpreter's finalization: objects of the program's module are finalized, unclosed
    # files flushed
    "finalizers_at_exit": Program(
        dedent(
            """\
            class Resource:
                def __init__(self, name):
                    self.name = name
                def __del__(self):
                    print('released', self.name, len(globals()))
            held = Resource('held')
            log = open('log.txt', 'w')
            log.write('unclosed')
            Resource('temporary')
            print('end')
            """
        ),
        fetch=("log.txt",),
    ),
    "input_at_end_of_stdin": Program(
        dedent(
            """\
            name = input('name? ')
            print('hello', name)
            input()
            """
        ),
        stdin="ada\n",
    ),
    "stdin_lines": Program(
        dedent(
            """\
            import sys
            n = int(input())
            rows = [list(map(int, line.split())) for line in sys.stdin]
            print(n, sum(map(sum, rows)))
            print(sys.stdin.isatty(), sys.stdout.isatty())
            """
        ),
        stdin="2\n1 2\n3 4\n",
    ),
}


@pytest.fixture(params=["root", "pod"], scope="module")
def any_server(request: pytest.FixtureRequest) -> SandboxProcess:
    return request.getfixturevalue("debian_root_server" if request.param == "root" else "pod_server")


def normalise(text: str, directory: str) -> str:
    """The program's directory becomes <dir>; unittest's measured seconds <t>; object addresses
    (`<function f at 0x7f...>`) <addr>."""
    text = text.replace(directory, "<dir>")
    text = re.sub(r"(Ran \d+ tests? in )\d+\.\d+s", r"\1<t>", text)
    return re.sub(r" at 0x[0-9a-f]+>", " at <addr>>", text)


def run_in_pool(server: SandboxProcess, program: Program) -> tuple[str, str, int, dict[str, str]]:
    files = {name: base64.b64encode(text.encode()).decode() for name, text in program.files.items()}
    body = {
        "code": program.code,
        "language": "python",
        "files": files,
        "stdin": program.stdin,
        "fetch_files": list(program.fetch),
    }
    response = server.post("/run_code", body)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["run_result"] is not None, answer
    result = answer["run_result"]
    assert server.workdir is not None
    own_directory = (
        re.escape(str(server.workdir.resolve())) + r"/\d+/s\d+-\d+"
    )  # <workdir>/<lease>/s<slot>-<ns>
    found = re.search(own_directory, result["stdout"] + result["stderr"])
    directory = found.group(0) if found else "\0"
    fetched = {name: base64.b64decode(answer["files"][name]).decode() for name in program.fetch}
    return (
        normalise(result["stdout"], directory),
        normalise(result["stderr"], directory),
        result["return_code"],
        fetched,
    )


def run_as_python_main(python: str, program: Program) -> tuple[str, str, int, dict[str, str]]:
    with tempfile.TemporaryDirectory(prefix="fidelity-") as directory:
        directory = os.path.realpath(directory)
        for name, text in {**program.files, "main.py": program.code}.items():
            path = Path(directory, name)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        env = {**worker_environment(), "HOME": directory, "TMPDIR": directory}
        done = subprocess.run(
            [python, "main.py"],
            cwd=directory,
            env=env,
            input=program.stdin.encode(),
            capture_output=True,
            timeout=60,
            # as from a shell's foreground: a test run in the background inherits SIGINT ignored,
            # and Python then leaves it ignored (os.kill(SIGINT) would print on)
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        return (
            normalise(done.stdout.decode(), directory),
            normalise(done.stderr.decode(), directory),
            done.returncode,
            {name: Path(directory, name).read_text() for name in program.fetch},
        )


@pytest.mark.parametrize("name", PROGRAMS)
def test_program_runs_as_python_main_py(any_server: SandboxProcess, name: str) -> None:
    program = PROGRAMS[name]
    expected = run_as_python_main(any_server.python, program)
    got = run_in_pool(any_server, program)
    assert got == expected, f"{name}: pool (stdout, stderr, exit code, fetched files) != python main.py's"
