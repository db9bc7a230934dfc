"""The class as an instructor deploys it (deploy/jupyterhub_config.py, unchanged): a real JupyterHub
with its proxy and PAM logins of system users with passwords.

Ten learners and an instructor log in through the hub's own login form (GET the form, POST it with its
``_xsrf``, as a browser does; one learner also in headless Chromium where it is installed); a user outside the class's two groups and a wrong password are refused.
Each learner gets a token from their own session and answers notebook 01's checkpoint to the class's
grading service (``hwlab class serve``, started by the hub as the class's account), from a process
running as that learner; one learner does it through the kit's own client (``checkpoint.check``). The
instructor's summary of the service's gradebook shows exactly those tries, reveals and passes. Every
forgery is tried as a learner: writing, editing, deleting or listing the gradebook, naming another
learner in the body, revealing before the tries, flooding past the quota, an escape sequence in a field.
One learner's server is spawned: the home is 0700 and what the kernel writes is 0600.

Needs root (useradd, chpasswd, the hub's setuid spawner), PAM (``/etc/pam.d/login``), node/npm (the proxy)
and Debian's /usr/bin/python3 (see tests/test_hub.py for why); skips otherwise.
"""
import asyncio
import grp
import http.cookiejar
import json
import os
import pwd
import re
import secrets
import shutil
import stat
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import asdict
from pathlib import Path

import pytest

from test_hub import RIGHT, _answer_cells, _api, _free_port, _hub_venv, _kit_copy, _proxy, _run_cells, _stop, CACHE

N_LEARNERS = 10


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *a, **k):
        return None


def _login(url: str, user: str, password: str) -> tuple[int, http.cookiejar.CookieJar]:
    """Log in through the hub's login form as a browser does; (status of the POST, cookies)."""
    jar = http.cookiejar.CookieJar()
    op = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar), _NoRedirect)
    with op.open(f"{url}/hub/login", timeout=60) as r:
        page = r.read().decode()
    xsrf = re.search(r'name="_xsrf"\s+value="([^"]+)"', page)
    assert xsrf, page[:2000]
    form = urllib.parse.urlencode({"username": user, "password": password, "_xsrf": xsrf.group(1)}).encode()
    try:
        with op.open(urllib.request.Request(f"{url}/hub/login?next=%2Fhub%2Fhome", data=form), timeout=120) as r:
            code = r.status
    except urllib.error.HTTPError as e:
        code = e.code
    return code, jar


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _login_in_chromium(url: str, user: str, password: str) -> tuple[str, list[str]]:
    """Log in through the login page in headless Chromium (typed into the form, the button pressed);
    (the page's URL after it, the names of the cookies the hub set)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        try:
            page = browser.new_page()
            page.goto(f"{url}/hub/login?next=%2Fhub%2Fhome", timeout=120_000)
            page.fill("#username_input", user)
            page.fill("#password_input", password)
            page.click("#login_submit")
            page.wait_for_url("**/hub/home", timeout=120_000)
            return page.url, [c["name"] for c in page.context.cookies()]
        finally:
            browser.close()


def _cookie(jar, name: str) -> str | None:
    return next((c.value for c in jar if c.name == name), None)


def _session_api(url: str, jar, path: str, method: str = "GET", body: dict | None = None) -> dict:
    """The hub's API with the login cookie and, for a POST, the xsrf token the hub's own page carries
    (its token page, as its JavaScript reads it)."""
    op = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    headers = {"Referer": f"{url}/hub/token", "Content-Type": "application/json"}
    if method != "GET":
        with op.open(f"{url}/hub/token", timeout=60) as r:
            headers["X-XSRFToken"] = re.search(r'xsrf_token: "([^"]+)"', r.read().decode()).group(1)
    req = urllib.request.Request(f"{url}/hub/api{path}", method=method, headers=headers,
                                 data=None if body is None else json.dumps(body).encode())
    with op.open(req, timeout=60) as r:
        return json.loads(r.read())


def _as(name: str, argv: list[str], groups=(), env: dict | None = None, timeout: int = 300, stdin: str = ""):
    pw = pwd.getpwnam(name)
    return subprocess.run(argv, input=stdin, user=pw.pw_uid, group=pw.pw_gid, extra_groups=list(groups), capture_output=True,
                          text=True, env={"HOME": pw.pw_dir, "PATH": "/usr/bin:/bin", **(env or {})},
                          timeout=timeout, cwd="/")


#: run as a learner: POST each body of stdin (a JSON list) to the service route argv[3] with the
#: token argv[2]; prints one JSON line per reply: [status, body]
POSTER = r"""
import json, sys, urllib.request, urllib.error
url, token, route = sys.argv[1], sys.argv[2], sys.argv[3]
bodies = json.loads(sys.stdin.read())
for b in bodies:
    req = urllib.request.Request(url + route, data=json.dumps(b).encode(), method="POST",
                                 headers={"Authorization": "token " + token} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            print(json.dumps([r.status, json.loads(r.read())]))
    except urllib.error.HTTPError as e:
        print(json.dumps([e.code, e.read().decode(errors="replace")[:300]]))
"""

#: run as a learner: every way at the gradebook's files
PROBE = r"""
import os, sys
book = sys.argv[1]
res = []
def t(what, fn):
    try:
        fn(); res.append(what + ":ALLOWED")
    except PermissionError:
        res.append(what + ":refused")
t("list", lambda: os.listdir(book))
t("create", lambda: open(os.path.join(book, sys.argv[2] + ".jsonl"), "a").write("{}\n"))
t("read", lambda: open(os.path.join(book, sys.argv[3] + ".jsonl")).read())
t("edit", lambda: open(os.path.join(book, sys.argv[3] + ".jsonl"), "a").write("{}\n"))
t("delete", lambda: os.unlink(os.path.join(book, sys.argv[3] + ".jsonl")))
t("symlink", lambda: os.symlink("/etc/passwd", os.path.join(book, "x.jsonl")))
print(" ".join(res))
"""


def _checkpoint01():
    """Notebook 01's checkpoint on the kit's recorded evidence (CPU machine: the notebook's own path)."""
    from hwlab.course.checkpoint import Answer, Checkpoint, Prediction
    from hwlab.core import evidence
    from hwlab.diagnosis import flowchart
    from hwlab.labs import bandwidth as lab

    rec = evidence.recorded("lab01_bandwidth")
    result = flowchart.walk_cases(lab.result_from_evidence(rec))
    ev = result.evidence["unfused"]
    pred = Prediction("speed-up", result.speedup("unfused", "fused"), "x", band_pct=40.0)
    cp = Checkpoint("01", result.diagnoses["unfused"], ev, prediction=pred, source=rec.label)
    m = next(m for m in ("dram_pct_of_peak", "dram_pct_estimated") if m in ev)
    right = Answer("G", m, float(ev[m]), pred.actual)
    wrong = Answer("L", "sm_busy_pct", 50.0, 1.0)
    not_leaf = Answer("D", m, float(ev[m]), pred.actual)
    return cp, right, wrong, not_leaf


@pytest.mark.slow
def test_learners_log_in_and_are_graded_on_the_server():
    if os.geteuid() != 0 or not all(shutil.which(x) for x in ("useradd", "chpasswd", "npm")) \
            or not Path("/usr/bin/python3").exists() or not Path("/etc/pam.d/login").exists():
        pytest.skip("needs root, useradd, chpasswd, npm, /usr/bin/python3 and PAM (/etc/pam.d/login)")
    from hwlab.course import gradebook

    CACHE.mkdir(parents=True, exist_ok=True)
    os.chmod(CACHE, 0o755)
    venv, chp = _hub_venv(), _proxy()
    if subprocess.run([str(venv / "bin" / "python"), "-c", "import pamela"], capture_output=True).returncode:
        pytest.skip("pamela (JupyterHub's PAM binding) is not importable in the hub's venv")
    base = Path(tempfile.mkdtemp(prefix="hwlab-login-", dir="/tmp"))
    os.chmod(base, 0o755)
    tag = secrets.token_hex(2)
    lgroup, igroup = f"hwl{tag}l", f"hwl{tag}i"
    learners = [f"hwl{tag}s{i}" for i in range(N_LEARNERS)]
    teach, klass, outsider = f"hwl{tag}t", f"hwl{tag}c", f"hwl{tag}x"
    pw = {u: secrets.token_urlsafe(12) for u in [*learners, teach, outsider]}
    made_users, made_groups, hub = [], [], None
    try:
        for g in (lgroup, igroup):
            subprocess.run(["groupadd", g], check=True)
            made_groups.append(g)
        for u, g in [*((u, lgroup) for u in learners), (teach, igroup), (outsider, None), (klass, None)]:
            subprocess.run(["useradd", "-m", "-s", "/bin/sh", *(["-G", g] if g else []), u], check=True)
            made_users.append(u)
        subprocess.run(["chpasswd"], input="".join(f"{u}:{p}\n" for u, p in pw.items()), text=True, check=True)
        kit = _kit_copy(base, venv)
        classroot = base / "class"
        classroot.mkdir()
        os.chown(classroot, pwd.getpwnam(klass).pw_uid, pwd.getpwnam(klass).pw_gid)
        book = classroot / "gradebook"  # made as the guide makes it: the class account's, the instructors' group
        subprocess.run(["install", "-d", "-o", klass, "-g", igroup, "-m", "2750", str(book)], check=True)
        state = base / "hub"
        port, gport, admin_token = _free_port(), _free_port(), secrets.token_hex(16)
        cfg = base / "test_config.py"
        cfg.write_text(
            f"c = get_config()\nload_subconfig({str(kit / 'deploy' / 'jupyterhub_config.py')!r})\n"
            f"c.JupyterHub.hub_port = {_free_port()}\n"
            f"c.ConfigurableHTTPProxy.api_url = 'http://127.0.0.1:{_free_port()}'\n"
            f"c.JupyterHub.services.append({{'name': 'classtest', 'api_token': {admin_token!r}}})\n"
            "c.JupyterHub.load_roles.append({'name': 'classtest', 'services': ['classtest'],"
            " 'scopes': ['admin:users', 'admin:servers', 'access:servers']})\n")
        env = {**os.environ, "HWLAB_KIT": str(kit), "HWLAB_BIN": str(venv / "bin"), "HWLAB_HUB_PROXY": str(chp),
               "HWLAB_LEARNERS_GROUP": lgroup, "HWLAB_INSTRUCTORS_GROUP": igroup, "HWLAB_HUB_STATE": str(state),
               "HWLAB_HUB_URL": f"http://127.0.0.1:{port}", "HWLAB_CLASS_USER": klass,
               "HWLAB_GRADEBOOK": str(book), "HWLAB_GRADER_PORT": str(gport)}
        env.pop("PYTHONPATH", None)
        env.pop("HWLAB_CLASS_DIR", None)
        log = open(base / "hub.log", "w")
        hub = subprocess.Popen([str(venv / "bin" / "python"), "-m", "jupyterhub", "-f", str(cfg)],
                               cwd=base, env=env, stdout=log, stderr=subprocess.STDOUT)
        url, grader = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{gport}/services/hwlab-grader/"
        hublog = lambda: (base / "hub.log").read_text()[-4000:]  # noqa: E731
        for _ in range(240):
            try:
                _api(f"{url}/hub/api/", admin_token)
                if (book / gradebook.MARKER).exists():
                    break
            except OSError:
                pass
            assert hub.poll() is None, hublog()
            time.sleep(0.5)
        else:
            pytest.fail(f"the hub or its grading service never came up:\n{hublog()}")
        # the hub's state is its own; the gradebook is the class account's, read by the instructors only
        assert stat.S_IMODE(state.stat().st_mode) == 0o700 and (state / "jupyterhub.sqlite").exists()
        st = book.stat()
        assert st.st_uid == pwd.getpwnam(klass).pw_uid and st.st_gid == grp.getgrnam(igroup).gr_gid
        assert stat.S_IMODE(st.st_mode) & 0o027 == 0

        # ---- logins through the form: ten learners and the instructor in; outsider and a wrong password out
        jars = {}
        if CHROMIUM:  # one learner through a real browser; skipped only where Chromium is not installed
            page, cookies = _login_in_chromium(url, learners[-1], pw[learners[-1]])
            assert page.endswith("/hub/home") and "jupyterhub-hub-login" in cookies, (page, cookies)
        for u in [*learners, teach]:
            code, jar = _login(url, u, pw[u])
            assert code == 302 and _cookie(jar, "jupyterhub-hub-login"), (u, code, hublog())
            jars[u] = jar
        for u, p in [(outsider, pw[outsider]), (learners[0], pw[learners[0]] + "x")]:
            code, jar = _login(url, u, p)
            assert code != 302 and not _cookie(jar, "jupyterhub-hub-login"), (u, code)
        assert _session_api(url, jars[teach], "/user")["admin"] is True
        me = _session_api(url, jars[learners[0]], "/user")
        assert me["name"] == learners[0] and me["admin"] is False
        tokens = {}
        for u in learners:
            try:
                tokens[u] = _session_api(url, jars[u], f"/users/{u}/tokens", "POST", {"note": "class"})["token"]
            except urllib.error.HTTPError as e:
                pytest.fail(f"{u} could not make a token from their session: {e.code} {e.read()[:300]}\n{hublog()}")

        # ---- answers, graded by the service, from processes running as each learner
        cp, right, wrong, not_leaf = _checkpoint01()
        body = lambda a, **kw: {**gradebook.request_checkpoint(cp, a, "01_bandwidth_bound"), **kw}  # noqa: E731
        plan = {}  # learner -> the answers sent, in order
        for i, u in enumerate(learners):
            plan[u] = ([right] if i < 4 else [wrong, right] if i < 6 else [wrong, wrong, wrong] if i < 8
                       else [not_leaf] if i == 8 else [])
        py = "/usr/bin/python3"
        for u in learners[:8] + learners[8:9]:
            if u == learners[1]:  # through the kit's own client, as the learner's kernel does
                continue
            r = _as(u, [py, "-c", POSTER, grader, tokens[u], "checkpoint"],
                    stdin=json.dumps([body(a) for a in plan[u]]))
            replies = [json.loads(x) for x in r.stdout.splitlines()]
            assert [c for c, _ in replies] == [200] * len(plan[u]), (u, r.stdout, r.stderr, hublog())
            assert [d["learner"] for _, d in replies] == [u] * len(plan[u])
        client = ("import json, sys\nfrom hwlab.course import checkpoint as C\nfrom hwlab.course.checkpoint import "
                  "Answer, Checkpoint, Prediction\nfrom hwlab.diagnosis import flowchart\n"
                  "d = json.loads(sys.stdin.read())\nev = d['evidence']\n"
                  "cp = Checkpoint('01', flowchart.diagnose(ev), ev, prediction=Prediction(**d['prediction']))\n"
                  "print(C.check(cp, Answer(**d['answer'])).status)\n")
        pw1 = pwd.getpwnam(learners[1])
        r = subprocess.run([str(venv / "bin" / "python"), "-c", client], input=json.dumps(body(right)), text=True,
                           user=pw1.pw_uid, group=pw1.pw_gid, capture_output=True, timeout=600, cwd="/",
                           env={"HOME": pw1.pw_dir, "PATH": "/usr/bin:/bin", "HWLAB_GRADER_URL": grader,
                                "JUPYTERHUB_API_TOKEN": tokens[learners[1]]})
        assert r.stdout.strip() == "passed", (r.stdout, r.stderr[-2000:])

        # ---- forgeries, each as a learner
        a, b = learners[6], learners[0]
        r = _as(a, [py, "-c", PROBE, str(book), a, b])
        assert r.stdout.split() == ["list:refused", "create:refused", "read:refused", "edit:refused",
                                    "delete:refused", "symlink:refused"], (r.stdout, r.stderr)
        # a body naming another learner and a passed status: graded as the sender, on the answer
        forged = {**body(wrong), "learner": b, "status": "passed", "passed": True}
        r = _as(a, [py, "-c", POSTER, grader, tokens[a], "checkpoint"], stdin=json.dumps([forged]))
        (code, d), = [json.loads(x) for x in r.stdout.splitlines()]
        assert code == 200 and d["learner"] == a and d["status"] == "wrong"
        plan[a].append(wrong)
        # no token, a made-up token: refused
        for tok in ("", secrets.token_hex(16)):
            r = _as(a, [py, "-c", POSTER, grader, tok, "checkpoint"], stdin=json.dumps([body(right)]))
            assert json.loads(r.stdout.splitlines()[0])[0] == 403, r.stdout
        # a reveal before three wrong tries is refused and not recorded; after them it is
        r = _as(learners[4], [py, "-c", POSTER, grader, tokens[learners[4]], "reveal"],
                stdin=json.dumps([{"checkpoint": "01"}]))
        assert json.loads(r.stdout)[1]["revealed"] is False
        r = _as(learners[7], [py, "-c", POSTER, grader, tokens[learners[7]], "reveal"],
                stdin=json.dumps([{"checkpoint": "01"}, {"checkpoint": "01"}]))
        assert [json.loads(x)[1]["revealed"] for x in r.stdout.splitlines()] == [True, True]
        # an escape sequence in a field reaches the record cleaned
        esc = {**body(wrong), "notebook": "\x1b[2J\x1b]0;pwned\x07nb", "source": "\x1b[31mred"}
        r = _as(learners[5], [py, "-c", POSTER, grader, tokens[learners[5]], "checkpoint"], stdin=json.dumps([esc]))
        assert json.loads(r.stdout)[0] == 200
        plan[learners[5]].append(wrong)
        # a flood stops at the learner's quota, and only that learner's
        flooder = learners[9]
        n = gradebook.MAX_RECORDS_PER_LEARNER + 5
        r = _as(flooder, [py, "-c", POSTER, grader, tokens[flooder], "checkpoint"], stdin=json.dumps([body(wrong)] * n))
        codes = [json.loads(x)[0] for x in r.stdout.splitlines()]
        assert codes.count(200) <= gradebook.MAX_RECORDS_PER_LEARNER and codes[-1] == 429, codes[-8:]
        n_flood = codes.count(200)

        # ---- a learner's server: the home private, what the kernel writes private
        u = learners[3]
        _api(f"{url}/hub/api/users/{u}/server", admin_token, "POST")
        for _ in range(480):
            srv = _api(f"{url}/hub/api/users/{u}", admin_token).get("servers", {}).get("")
            if srv and srv.get("ready"):
                break
            assert hub.poll() is None, hublog()
            time.sleep(0.5)
        else:
            pytest.fail(f"{u}'s server never became ready:\n{hublog()}")
        home = Path(pwd.getpwnam(u).pw_dir)
        assert stat.S_IMODE(home.stat().st_mode) == 0o700
        out = asyncio.run(_run_cells(url, u, admin_token, [
            "import os, pathlib\np = pathlib.Path.home() / 'notes.txt'\np.write_text('my answer')\n"
            "print(oct(os.stat(p).st_mode & 0o777), os.environ.get('HWLAB_GRADER_URL'))"]))
        assert out.split() == ["0o600", grader], out
        # notebook 01's checkpoint answered in the learner's own kernel: graded by the service
        nb01 = _api(f"{url}/user/{u}/api/contents/notebooks/01_bandwidth_bound.ipynb", admin_token)["content"]
        out = asyncio.run(_run_cells(url, u, admin_token, _answer_cells(nb01, RIGHT)))
        assert "checkpoint 01: passed" in out and "Traceback" not in out, out
        plan[u].append(right)

        # ---- drills drawn, revealed and graded by the service (its key; the learners never hold it)
        def post(u, route, body):
            r = _as(u, [py, "-c", POSTER, grader, tokens[u], route], stdin=json.dumps([body]))
            code, d = json.loads(r.stdout)
            assert code == 200, (u, route, d, r.stderr)
            return d
        d8 = post(learners[8], "drill/new", {"seed": 3})["drill"]
        leaf = post(learners[8], "drill/reveal", {"drill": d8})["leaf"]
        assert post(learners[8], "drill/submit", {"drill": d8, "leaf": leaf})["passed"] is False
        d0 = post(learners[0], "drill/new", {"seed": 3})["drill"]
        assert post(learners[0], "drill/submit", {"drill": d0, "leaf": leaf})["passed"] is True
        edited = {**d0, "observations": {**d0["observations"], "x_pct": 1.0}}
        r = _as(learners[0], [py, "-c", POSTER, grader, tokens[learners[0]], "drill/submit"],
                stdin=json.dumps([{"drill": edited, "leaf": leaf}]))
        assert json.loads(r.stdout)[0] == 400

        # ---- `hwlab drill` as a learner with the class's service configured: drawn, revealed and graded there
        hw = str(venv / "bin" / "hwlab")
        u4 = learners[4]
        home4 = pwd.getpwnam(u4).pw_dir
        genv = {"HWLAB_GRADER_URL": grader, "JUPYTERHUB_API_TOKEN": tokens[u4]}
        r = _as(u4, [hw, "drill", "new", "--seed", "3", "--fault", "none", "--dir", home4], env=genv)
        assert r.returncode == 2 and "--fault" in r.stderr, (r.returncode, r.stderr)
        r = _as(u4, [hw, "drill", "new", "--seed", "3", "--dir", home4, "--json"], env=genv)
        assert r.returncode == 0, r.stderr
        dfile = Path(json.loads(r.stdout)["file"])
        fault = post(learners[8], "drill/reveal", {"drill": d8})["fault"]
        assert fault not in dfile.read_text() and not Path(home4, ".config", "hwlab", "drill.key").exists()
        forge = ("import json, sys\nd = json.load(open(sys.argv[1]))\nk = next(k for k, v in d['observations'].items()"
                 " if isinstance(v, float))\nd['observations'][k] *= 0.5\njson.dump(d, open(sys.argv[2], 'w'))\n")
        r = _as(u4, [py, "-c", forge, str(dfile), f"{home4}/forged.json"])
        assert r.returncode == 0, r.stderr
        r = _as(u4, [hw, "drill", "submit", f"{home4}/forged.json", "--leaf", leaf], env=genv)
        assert r.returncode == 2 and "edited" in r.stderr, (r.returncode, r.stdout, r.stderr)
        r = _as(u4, [hw, "drill", "reveal", str(dfile)], env=genv)
        assert r.returncode == 0 and json.loads(r.stdout)["leaf"] == leaf, r.stderr
        r = _as(u4, [hw, "drill", "submit", str(dfile), "--leaf", leaf, "--json"], env=genv)
        assert r.returncode == 1 and json.loads(r.stdout)["status"] == "submitted after reveal", (r.stdout, r.stderr)
        assert not Path(home4, ".config", "hwlab", "drill.key").exists()
        # notebook 07's own cells in learner 3's kernel: drawn and graded by the service (seed 3: the same fault)
        nb07 = _api(f"{url}/user/{u}/api/contents/notebooks/07_drills.ipynb", admin_token)["content"]
        code = ["".join(c["source"]) for c in nb07["cells"] if c["cell_type"] == "code"]
        draw, sub = code[0], next(c for c in code if "MY_LEAF = None" in c)
        assert "drillclient.draw()" in draw
        out = asyncio.run(_run_cells(url, u, admin_token, [
            draw.replace("drillclient.draw()", "drillclient.draw(3)"),
            sub.replace("MY_LEAF = None", f"MY_LEAF = {leaf!r}"),
            "import pathlib\nprint('key here:', (pathlib.Path.home() / '.config/hwlab/drill.key').exists())"]))
        assert "drawn and sealed by the class's grading service" in out and "PASSED: " in out, out
        assert "key here: False" in out and "Traceback" not in out, out
        # exercise checks in the same kernel: a value check graded again by the service, a kernel check
        # recorded as learner-reported (its code never runs as the class account)
        out = asyncio.run(_run_cells(url, u, admin_token, [
            "import torch\nfrom hwlab.course.exercise import check_kernel, check_value\n"
            "print('v1', check_value('leaf of the case', 'L', 'G', 'read B again').status)\n"
            "print('v2', check_value('leaf of the case', 'G', 'G', 'read B again').status)\n"
            "from hwlab.course import tries\nprint('r1', tries.reveal('leaf of the case'))\n"
            "for _ in range(2):\n    check_value('leaf of the case', 'L', 'G', 'read B again')\n"
            "print('r2', tries.reveal('leaf of the case'))\n"
            "print('k', check_kernel('copy kernel', lambda x: x.clone(), lambda x: x.clone(), "
            "lambda: (torch.ones(64),), tol=0.0, n_bytes=512).status)"]))
        assert "v1 wrong" in out and "v2 passed" in out and "k passed" in out and "Traceback" not in out, out
        assert "r1 leaf of the case: the answer can be revealed after 3 tries" in out, out
        assert "r2 leaf of the case, revealed: answer = G" in out, out

        # ---- the instructor's summary from the service's gradebook: exactly what was sent
        r = _as(teach, [hw, "class", "summary", str(book), "--json"], [grp.getgrnam(igroup).gr_gid])
        assert r.returncode == 0, r.stderr
        s = json.loads(r.stdout)
        people = s["per_learner"]
        assert sorted(people) == sorted(learners) and teach not in people and klass not in people
        row = s["items"]["checkpoint: 01"]
        for u in learners[:9]:
            sent = plan[u]
            mine = people[u]["items"].get("checkpoint: 01", {"attempts": 0, "passed": False})
            assert mine["attempts"] == len(sent), (u, mine, sent)
            assert mine["passed"] == (right in sent), (u, mine)
            assert bool(mine.get("revealed")) == (u == learners[7]), (u, mine)
        assert people[flooder]["items"]["checkpoint: 01"]["attempts"] == n_flood
        assert row["revealed"] == 1 and row["learners_passed"] == 6
        assert row["not_leaves"] == {"D": 1} and "D" not in row["wrong_leaves"]
        (drow,) = [r for k, r in s["items"].items() if k.startswith("drill:")]
        assert drow["item"] == fault
        # learner 8 (revealed, then submitted), learner 0 (passed), learner 4's CLI (revealed, then
        # submitted), learner 3's notebook (passed); the edited copy was refused and never recorded
        assert (drow["attempts"], drow["passed"], drow["revealed"], drow["learners_passed"]) == (4, 2, 2, 2)
        ex = {k: r for k, r in s["items"].items() if k.startswith("exercise:")}
        (vrow,) = [r for r in ex.values() if r["item"] == "leaf of the case"]
        (krow,) = [r for r in ex.values() if r["item"] == "copy kernel"]
        assert (vrow["attempts"], vrow["passed"], vrow["wrong_leaves"], vrow["revealed"]) == (4, 1, {"L": 3}, 1)
        assert vrow.get("learner_reported") is None
        assert (krow["attempts"], krow["passed"], krow["learner_reported"], krow["learner_reported_passed"]) == (1, 0, 1, 1)
        r = _as(teach, [hw, "class", "summary", str(book)], [grp.getgrnam(igroup).gr_gid])
        assert r.returncode == 0 and "\x1b" not in r.stdout + r.stderr and "\x07" not in r.stdout
        assert "learner-reported (not re-checked by the service, never counted as passed): 1 results" in r.stdout
        r = _as(learners[2], [hw, "class", "summary", str(book)])
        assert r.returncode == 2 and r.stdout == "", (r.stdout, r.stderr)

        # ---- a drill submitted into the class drop box by a learner, who cannot write the folder itself
        box = base / "box"
        subprocess.run([hw, "class", "init", str(box), "--group", igroup, "--owner", teach], check=True,
                       capture_output=True)
        u = learners[2]
        home2 = pwd.getpwnam(u).pw_dir
        kenv = {"HWLAB_DRILL_KEY_FILE": f"{home2}/drill.key"}
        r = _as(u, [hw, "drill", "new", "--seed", "3", "--fault", "slow_link_rank", "--dir", f"{home2}/d"], env=kenv)
        assert r.returncode == 0, r.stderr
        drill = next(Path(home2, "d").glob("drill-*.json"))
        r = _as(u, [hw, "drill", "submit", str(drill), "--leaf", "L", "--learner", u, "--dir", f"{home2}/d",
                    "--class-dir", str(box)], env=kenv)
        assert r.returncode == 0, r.stderr
        (sub,) = [p for p in (box / "inbound").iterdir() if p.name.startswith("drill-")]
        assert sub.owner() == u and json.loads(sub.read_text())["learner"] == u
        # a 1 GiB file (sparse) and a hidden one dropped in by another learner: over the per-learner quota,
        # never read by the summary, removed by the instructor who owns the box (no root)
        big = learners[5]
        drop = ("import os, sys\nfd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640)\n"
                "os.ftruncate(fd, 1 << 30)\nos.close(fd)\nopen(sys.argv[2], 'x').write('{}')\n")
        r = _as(big, [py, "-c", drop, str(box / "inbound" / "result-big.json"), str(box / "inbound" / ".hidden")])
        assert r.returncode == 0, r.stderr
        ig = [grp.getgrnam(igroup).gr_gid]
        r = _as(teach, [hw, "class", "summary", str(box), "--json"], ig)
        assert r.returncode == 0, r.stderr
        s = json.loads(r.stdout)
        assert sorted(s["per_learner"]) == [u] and f"learner {big} is over the drop box's quota" in r.stderr
        r = _as(big, [hw, "class", "prune", str(box)])
        assert r.returncode == 2 and (box / "inbound" / "result-big.json").exists(), (r.stdout, r.stderr)
        r = _as(teach, [hw, "class", "prune", str(box), "--json"], ig)
        assert r.returncode == 0, (r.stdout, r.stderr)
        assert sorted(g["name"] for g in json.loads(r.stdout)["removed"]) == [".hidden", "result-big.json"]
        assert sub.exists() and not (box / "inbound" / "result-big.json").exists()
        r = _as(teach, [hw, "class", "summary", str(box), "--json"], ig)
        assert r.returncode == 0 and "quota" not in r.stderr, r.stderr

    finally:
        leftovers = _stop(hub, made_users, base) if hub else []
        for u in made_users:
            subprocess.run(["userdel", "-r", u], capture_output=True)
        for g in made_groups:
            subprocess.run(["groupdel", g], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)
    assert leftovers == [], f"processes left after the hub stopped: {leftovers}"
