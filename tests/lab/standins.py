"""Stand-ins, built locally, for every image critest (cri-tools v1.37.0) pulls.

Each follows what cri-tools' ``images/`` Dockerfiles put in the real one, or what the
specs in ``pkg/validate`` check of it; all are built from Debian's static busybox:

- the base is busybox with its applets as **hard links** (as in the real image: with
  symlinks, masking ``/bin/ls`` would mask the shell too), and busybox's own
  ``/etc/passwd`` and ``/etc/group`` (``www-data`` is uid 33); Debian's busybox 1.35 has
  no ``pgrep`` and no ``ipcs``, which specs run: small C programs stand in for them;
- ``test-image-user-*``: the base with ``USER`` 1002, www-data, 1003:1004, www-data:1004;
- ``test-image-predefined-group``: user default-user (1000) in group
  group-defined-in-image (50000), ``USER 1000``;
- ``test-image-{1,2,3,latest,digest}`` and ``test-image-tag:{test,all}``: the base plus a
  file named like the build argument, so each is a different image;
  ``test-image-tags:{1,2,3}``: one image under three tags;
- nginx (port 80) and ``hostnet-nginx-<arch>`` (port 12003): a small ``nginx`` program
  that re-executes itself as ``nginx: master process nginx -g daemon off;`` (what specs
  look for in ``/proc/1/cmdline``), writes its pid to ``/var/run/nginx.pid`` and runs
  busybox httpd;
- httpd: busybox httpd on port 80, saying "httpd" in its log;
- nonewprivs: a setuid-root program that prints ``Effective uid: N``;
- ``pause:3.9`` under registry.k8s.io and k8s.gcr.io: the lab pause program (labelled,
  so it is not the same image as the sandbox image).

Not possible: ``test-image-digest@sha256:9700f9…`` names a digest only the real image has.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.lab.images import PAUSE_C_SOURCE
from tests.lab.oci import Image, TarWriter, build_image, oci_arch
from tests.lab.registry import Catalog

__all__ = ["E2E", "STAGING", "StandIn", "StandInError", "build_catalog", "build_standins"]

STAGING = "gcr.io/k8s-staging-cri-tools/"  # cri-tools' pkg/validate/consts.go
E2E = "registry.k8s.io/e2e-test-images/"  # cri-tools' framework.DefaultRegistryE2ETestImagesPrefix

_PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_LABEL = "io.crihook.lab.standin"

# busybox 1.37's own /etc/passwd and /etc/group (the image the Dockerfiles start FROM).
_PASSWD = """\
root:x:0:0:root:/root:/bin/sh
daemon:x:1:1:daemon:/usr/sbin:/bin/false
bin:x:2:2:bin:/bin:/bin/false
sys:x:3:3:sys:/dev:/bin/false
sync:x:4:100:sync:/bin:/bin/sync
mail:x:8:8:mail:/var/spool/mail:/bin/false
www-data:x:33:33:www-data:/var/www:/bin/false
operator:x:37:37:Operator:/var:/bin/false
nobody:x:65534:65534:nobody:/home:/bin/false
"""
_GROUP = """\
root:x:0:
daemon:x:1:
bin:x:2:
sys:x:3:
adm:x:4:
tty:x:5:
disk:x:6:
lp:x:7:
mail:x:8:
kmem:x:9:
wheel:x:10:root
cdrom:x:11:
dialout:x:18:
floppy:x:19:
video:x:28:
audio:x:29:
tape:x:32:
www-data:x:33:
operator:x:37:
staff:x:50:
utmp:x:43:
users:x:100:
nogroup:x:65534:
"""

NGINX_TITLE = "nginx: master process nginx -g daemon off;"
NGINX_C_SOURCE = r"""
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define TITLE "@TITLE@"
static pid_t child = -1;

static void on_stop(int sig) {
    (void)sig;
    if (child > 0) kill(child, SIGTERM);
    _exit(0);
}

int main(int argc, char **argv) {
    if (argc != 1 || strcmp(argv[0], TITLE) != 0) {
        /* Become "nginx: master process ..." in /proc/self/cmdline, as nginx does. */
        char *args[] = {TITLE, NULL};
        execv("/usr/sbin/nginx", args);
        perror("nginx: re-exec");
        return 1;
    }
    const char *port = getenv("NGINX_PORT");
    if (port == NULL) port = "80";
    FILE *f = fopen("/var/run/nginx.pid", "w");
    if (f == NULL) {
        perror("nginx: /var/run/nginx.pid");
        return 1;
    }
    fprintf(f, "%d\n", (int)getpid());
    fclose(f);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGQUIT, &sa, NULL);
    child = fork();
    if (child == 0) {
        char *httpd[] = {"httpd", "-f", "-p", (char *)port, "-h", "/usr/share/nginx/html", NULL};
        execvp("httpd", httpd);
        perror("nginx: httpd");
        _exit(127);
    }
    printf("nginx (crihook lab stand-in): serving /usr/share/nginx/html on :%s\n", port);
    fflush(stdout);
    for (;;) {
        int status;
        pid_t pid = waitpid(-1, &status, 0);
        if (pid == child) return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
        if (pid < 0 && errno != EINTR) pause();
    }
}
""".replace("@TITLE@", NGINX_TITLE)

NNP_C_SOURCE = r"""
#include <stdio.h>
#include <unistd.h>

int main(void) {
    printf("Effective uid: %d\n", (int)geteuid());
    return 0;
}
"""

# Debian's busybox 1.35 has no pgrep and no ipcs applets; the real busybox image has both
# and specs run them (`pgrep sleep`, `ipcs -m`). Small static stand-ins, busybox-like.
PGREP_C_SOURCE = r"""
#include <dirent.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* pgrep [-f] PATTERN: pids whose name (or, with -f, command line) matches PATTERN. */
static int read_file(const char *path, char *buf, size_t size) {
    FILE *f = fopen(path, "r");
    if (f == NULL) return -1;
    size_t n = fread(buf, 1, size - 1, f);
    fclose(f);
    for (size_t i = 0; i < n; i++)
        if (buf[i] == '\0') buf[i] = ' ';
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' ')) n--;
    buf[n] = '\0';
    return 0;
}

int main(int argc, char **argv) {
    int full = 0, arg = 1;
    if (arg < argc && strcmp(argv[arg], "-f") == 0) { full = 1; arg++; }
    if (arg != argc - 1) {
        fprintf(stderr, "usage: pgrep [-f] PATTERN\n");
        return 2;
    }
    regex_t re;
    if (regcomp(&re, argv[arg], REG_EXTENDED | REG_NOSUB) != 0) {
        fprintf(stderr, "pgrep: bad pattern\n");
        return 2;
    }
    DIR *proc = opendir("/proc");
    if (proc == NULL) { perror("pgrep: /proc"); return 3; }
    int found = 0;
    long self = (long)getpid();
    struct dirent *e;
    while ((e = readdir(proc)) != NULL) {
        char *end;
        long pid = strtol(e->d_name, &end, 10);
        if (*end != '\0' || pid <= 0 || pid == self) continue;
        char path[64], text[4096];
        snprintf(path, sizeof path, "/proc/%ld/%s", pid, full ? "cmdline" : "comm");
        if (read_file(path, text, sizeof text) != 0) continue;
        if (regexec(&re, text, 0, NULL, 0) == 0) { printf("%ld\n", pid); found = 1; }
    }
    closedir(proc);
    return found ? 0 : 1;
}
"""

IPCS_C_SOURCE = r"""
#include <stdio.h>

/* ipcs [-m]: the shared memory segments of this IPC namespace, as busybox prints them. */
int main(void) {
    FILE *f = fopen("/proc/sysvipc/shm", "r");
    printf("\n------ Shared Memory Segments --------\n");
    printf("key        shmid      owner      perms      bytes      nattch     status\n");
    if (f == NULL) return 0;
    char line[512];
    if (fgets(line, sizeof line, f) == NULL) { fclose(f); return 0; }  /* header */
    long long key, id, size, cpid, lpid, nattch, uid;
    unsigned perms;
    while (fgets(line, sizeof line, f) != NULL) {
        if (sscanf(line, "%lld %lld %o %lld %lld %lld %lld %lld", &key, &id, &perms, &size,
                   &cpid, &lpid, &nattch, &uid) != 8) continue;
        printf("0x%08llx %-10lld %-10lld %-10o %-10lld %-10lld\n", key & 0xffffffffLL, id,
               uid, perms & 0777, size, nattch);
    }
    fclose(f);
    return 0;
}
"""

_HTTPD_FOREGROUND = b"""#!/bin/sh
echo "httpd (crihook lab stand-in): serving /usr/local/apache2/htdocs on :80"
exec httpd -f -p 80 -h /usr/local/apache2/htdocs
"""
_INDEX_HTML = b"<html><body><h1>It works! (crihook lab stand-in)</h1></body></html>\n"


class StandInError(RuntimeError):
    """A stand-in could not be built (missing busybox or gcc, compile error)."""


@dataclass(frozen=True)
class StandIn:
    """One image and every reference critest pulls it by."""

    name: str
    refs: tuple[str, ...]
    image: Image


def build_catalog(busybox: Path | None = None) -> Catalog:
    catalog = Catalog()
    for standin in build_standins(busybox):
        catalog.add(standin.image, standin.refs)
    return catalog


def build_standins(busybox: Path | None = None) -> list[StandIn]:
    busybox = busybox or _find_busybox()
    with tempfile.TemporaryDirectory(prefix="crihook-standins-") as tmp:
        nginx = _compile(Path(tmp), "nginx", NGINX_C_SOURCE)
        nnp = _compile(Path(tmp), "nnp", NNP_C_SOURCE)
        pause = _compile(Path(tmp), "pause", PAUSE_C_SOURCE)
        extra_applets = {
            "bin/pgrep": _compile(Path(tmp), "pgrep", PGREP_C_SOURCE),
            "bin/ipcs": _compile(Path(tmp), "ipcs", IPCS_C_SOURCE),
        }
    base = _busybox_layer(busybox, extra_applets)

    def bb(
        name: str, refs: Sequence[str], extra: Sequence[bytes] = (), **config: object
    ) -> StandIn:
        """busybox plus ``extra`` layers; ``config`` overrides (None removes a key)."""
        cfg: dict[str, object] = {"Cmd": ["sh"], "Env": [_PATH_ENV], "Labels": {_LABEL: name}}
        cfg.update(config)
        cfg = {k: v for k, v in cfg.items() if v is not None}
        return StandIn(name, tuple(refs), build_image([base, *extra], cfg))

    def with_file(name: str, refs: Sequence[str], file: str) -> StandIn:
        # images/image-test/Dockerfile: ADD ${TEST} ${TEST}
        return bb(name, refs, [_layer(files={file: b""})])

    def nginx_like(name: str, refs: Sequence[str], port: int) -> StandIn:
        layer = _layer(
            dirs={"etc/nginx": 0, "usr/share/nginx": 0, "usr/share/nginx/html": 0},
            files={
                "usr/sbin/nginx": (nginx, 0o755),
                "usr/share/nginx/html/index.html": _INDEX_HTML,
            },
        )
        return bb(
            name,
            refs,
            [layer],
            Cmd=["nginx", "-g", "daemon off;"],
            Env=[_PATH_ENV, f"NGINX_PORT={port}"],
            ExposedPorts={f"{port}/tcp": {}},
            StopSignal="SIGQUIT",
        )

    predefined_group = _layer(
        dirs={"home/default-user": 1000},
        files={
            "etc/passwd": (
                _PASSWD + "default-user:x:1000:1000:Linux User,,,:/home/default-user:/bin/sh\n"
            ).encode(),
            "etc/group": (
                _GROUP + "default-user:x:1000:\ngroup-defined-in-image:x:50000:default-user\n"
            ).encode(),
        },
    )
    httpd = _layer(
        dirs={"usr/local/apache2": 0, "usr/local/apache2/htdocs": 0},
        files={
            "usr/local/bin/httpd-foreground": (_HTTPD_FOREGROUND, 0o755),
            "usr/local/apache2/htdocs/index.html": _INDEX_HTML,
        },
    )
    users = (
        ("uid", "1002"),
        ("username", "www-data"),
        ("uid-group", "1003:1004"),
        ("username-group", "www-data:1004"),
    )
    different = (
        "test-image-1",
        "test-image-2",
        "test-image-3",
        "test-image-latest",
        "test-image-digest",
    )
    return [
        bb("busybox", [E2E + "busybox:1.29-2"]),
        *(bb(f"user-{n}", [STAGING + f"test-image-user-{n}"], User=user) for n, user in users),
        bb(
            "predefined-group",
            [STAGING + "test-image-predefined-group"],
            [predefined_group],
            User="1000",
        ),
        *(with_file(n, [STAGING + f"{n}:latest"], n) for n in different),
        with_file("tags", [STAGING + f"test-image-tags:{t}" for t in (1, 2, 3)], "same-image"),
        with_file("tag-test", [STAGING + "test-image-tag:test"], "test"),
        with_file("tag-all", [STAGING + "test-image-tag:all"], "all"),
        nginx_like("nginx", [E2E + "nginx:1.14-2"], port=80),
        nginx_like("hostnet-nginx", [STAGING + f"hostnet-nginx-{oci_arch()}:latest"], port=12003),
        bb(
            "httpd",
            [E2E + "httpd:2.4.39-4"],
            [httpd],
            Cmd=["httpd-foreground"],
            ExposedPorts={"80/tcp": {}},
        ),
        bb(
            "nonewprivs",
            [E2E + "nonewprivs:1.3"],
            [_layer(files={"usr/local/bin/nnp": (nnp, 0o4755)})],
            Entrypoint=["/usr/local/bin/nnp"],
            Cmd=None,
        ),
        StandIn(
            "pause",
            ("registry.k8s.io/pause:3.9", "k8s.gcr.io/pause:3.9"),
            build_image(
                [_layer(files={"pause": (pause, 0o755)})],
                {"Entrypoint": ["/pause"], "Labels": {_LABEL: "pause"}},
            ),
        ),
    ]


# -- layers ------------------------------------------------------------------------------------


def _find_busybox() -> Path:
    for candidate in ("/bin/busybox", "/usr/bin/busybox"):
        if os.access(candidate, os.X_OK):
            return Path(candidate)
    raise StandInError("busybox not found: run tests/lab/install.sh (busybox-static)")


def _busybox_layer(busybox: Path, extra_applets: Mapping[str, bytes]) -> bytes:
    """busybox with hard-linked applets, plus ``extra_applets`` (path -> static binary) for
    the ones this busybox lacks."""
    binary = busybox.read_bytes()
    proc = subprocess.run(
        [str(busybox), "--list-full"], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise StandInError(f"{busybox} --list-full failed: {proc.stderr.strip()}")
    applets = sorted(
        {a.strip() for a in proc.stdout.splitlines() if a.strip()} - {"bin/busybox", *extra_applets}
    )
    wanted = {str(Path(a).parent) for a in applets} | {
        "bin",
        "dev",
        "etc",
        "home",
        "proc",
        "root",
        "sys",
        "usr",
        "var/run",
        "var/spool/mail",
        "var/www",
    }
    layer = TarWriter()
    for d in _with_parents(wanted):  # sorted: every parent comes before its children
        layer.dir(d, mode=0o700 if d == "root" else 0o755)
    layer.dir("tmp", mode=0o1777)
    layer.file("bin/busybox", binary, mode=0o755)
    for applet in applets:
        layer.hardlink(applet, "bin/busybox")
    for path, program in sorted(extra_applets.items()):
        layer.file(path, program, mode=0o755)
    layer.file("etc/passwd", _PASSWD.encode())
    layer.file("etc/group", _GROUP.encode())
    layer.file("etc/hostname", b"")
    return layer.finish()


def _layer(
    *,
    dirs: Mapping[str, int] | None = None,
    files: Mapping[str, bytes | tuple[bytes, int]] | None = None,
) -> bytes:
    """A layer of ``dirs`` (path -> owner uid and gid) and ``files`` (path -> bytes or
    (bytes, mode)); missing parent directories are added, owned by root."""
    owners = dict(dirs or {})
    layer = TarWriter()
    for path in _with_parents({*owners, *(str(Path(f).parent) for f in files or {})}):
        owner = owners.get(path, 0)
        layer.dir(path, uid=owner, gid=owner)
    for path, content in sorted((files or {}).items()):
        data, mode = content if isinstance(content, tuple) else (content, 0o644)
        layer.file(path, data, mode=mode)
    return layer.finish()


def _with_parents(paths: Iterable[str]) -> list[str]:
    """The relative dirs ``paths`` and all their parents, sorted (parents first)."""
    return sorted({str(p) for d in paths for p in (Path(d), *Path(d).parents) if str(p) != "."})


def _compile(tmp: Path, name: str, source: str) -> bytes:
    src = tmp / f"{name}.c"
    out = tmp / name
    src.write_text(source)
    # -static: the images have no libc; -s strips symbols (smaller, and no build paths).
    argv = ["gcc", "-static", "-Os", "-s", "-o", str(out), str(src)]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=300)
    except FileNotFoundError as exc:
        raise StandInError("gcc not found: run tests/lab/install.sh") from exc
    if proc.returncode != 0:
        raise StandInError(f"compiling the {name} stand-in failed:\n{proc.stderr.strip()}")
    return out.read_bytes()
