"""[protocol] Every string that crosses a process boundary: environment names, file names, stages.

Host, supervisor and kernel agree on these and on nothing else, so each lives here once.
"""

from __future__ import annotations

from typing import Final

KERNEL_NAME: Final = "ivralo"
DISPLAY_NAME: Final = "Python (ivralo)"
PROVISIONER_NAME: Final = "ivralo-provisioner"
# The hermetic surface's kernelspec (the standard library and ivralo's helpers only).
HERMETIC_KERNEL_NAME: Final = "ivralo-hermetic"
HERMETIC_DISPLAY_NAME: Final = "Python (ivralo, hermetic)"
IMPLEMENTATION: Final = "ivralo"

# Environment the host (provisioner or Session) and the supervisor hand to the kernel.
ENV_WORKSPACE: Final = "IVRALO_WORKSPACE"
ENV_POLICY_FILE: Final = "IVRALO_POLICY_FILE"
ENV_CONFIG_HOME: Final = "IVRALO_CONFIG_HOME"
# The person's scrub rule (environment.json in the config home), passed on by the hosts as JSON.
ENV_SCRUB_RULE: Final = "IVRALO_SCRUB_RULE"
ENV_MEMORY_LIMIT: Final = "IVRALO_MEMORY_LIMIT_BYTES"
ENV_RLIMIT_NOFILE: Final = "IVRALO_RLIMIT_NOFILE"
ENV_ROLE: Final = "IVRALO_ROLE"
ENV_AUDIENCE: Final = "IVRALO_AUDIENCE"  # "person" or "agent": who reads the kernel's refusals
ENV_DEADLINE_MS: Final = "IVRALO_DEADLINE_MS"
ENV_HISTORY_CAP: Final = "IVRALO_HISTORY_CAP_BYTES"
ENV_HISTORY_CAP_COUNT: Final = "IVRALO_HISTORY_CAP_COUNT"
ENV_REPLACEMENT: Final = "IVRALO_REPLACEMENT"  # "1": this kernel replaces one the watchdog killed
ENV_LANDLOCK: Final = "IVRALO_LANDLOCK"  # "off" turns the OS write floor off (tests, diagnosis)
ENV_LANDLOCK_NETWORK: Final = "IVRALO_LANDLOCK_NETWORK"  # "on": the TCP connect floor (off by default)
ENV_TMPDIR: Final = "IVRALO_TMPDIR"  # the kernel's private temp folder, made and removed by the supervisor
ENV_INTERRUPT_GRACE_MS: Final = "IVRALO_INTERRUPT_GRACE_MS"
ENV_SURFACE: Final = "IVRALO_SURFACE"  # "project" or "hermetic"
# A project's interpreter without ivralo: the folders of ivralo's own packages (protocol.bootstrap).
ENV_CODE_PATH: Final = "IVRALO_CODE_PATH"
# What of the private path the kernel imports (protocol.private_code), comma-separated: its top-level
# modules and its distributions (host.jupyter.kernel_closure: ipykernel, what it needs, ivralo_kernel).
ENV_CODE_MODULES: Final = "IVRALO_CODE_MODULES"
ENV_CODE_DISTS: Final = "IVRALO_CODE_DISTS"
# Which interpreter the kernel runs and why ("uv project (.venv, uv 0.4.0)"): kernel_info reports it.
ENV_INTERPRETER: Final = "IVRALO_INTERPRETER"
# The static code gate for a raw launch: "on", and its lists comma-separated (unset: the defaults).
ENV_CODE_GATE: Final = "IVRALO_CODE_GATE"
ENV_DEVICES: Final = "IVRALO_DEVICES"  # auto, none, or device paths separated by commas (a launch without a host)
ENV_CODE_GATE_MODULES: Final = "IVRALO_CODE_GATE_MODULES"
ENV_CODE_GATE_DENIED_NAMES: Final = "IVRALO_CODE_GATE_DENIED_NAMES"
ENV_CODE_GATE_DENIED_ATTRIBUTES: Final = "IVRALO_CODE_GATE_DENIED_ATTRIBUTES"
ENV_CODE_GATE_DENIED_CALLS: Final = "IVRALO_CODE_GATE_DENIED_CALLS"
# The id of the broker comm, chosen by the host before launch. Nothing about the comm travels on
# shell, where a client's first execute_request could overtake a comm_open, and no frontend ever sees
# it opened (a frontend closes comms whose target it does not know). Requests and answers travel on
# the broker's socket (ENV_BROKER_FD), each request naming the execution it comes from; the id is
# what the host's hello names.
ENV_BROKER_COMM: Final = "IVRALO_BROKER_COMM"
# Set by the supervisor only: the pipe the kernel reports its start-up stages on, and the
# supervisor's pid (the kernel's parent poller follows it through JPY_PARENT_PID too).
ENV_STAGE_FD: Final = "IVRALO_STAGE_FD"
ENV_SUPERVISOR_PID: Final = "IVRALO_SUPERVISOR_PID"
ENV_LAUNCHED_AT: Final = "IVRALO_LAUNCHED_AT"
ENV_SUPERVISOR_LAYERS: Final = "IVRALO_SUPERVISOR_LAYERS"  # "subreaper=1,parent_death_signal=1"
ENV_PARENT_PID: Final = "JPY_PARENT_PID"
# The OS sandbox: "bwrap" when the kernel runs inside one, else why not (the fallback's reason).
ENV_SANDBOX: Final = "IVRALO_SANDBOX"
# "user/max_inotify_instances=16 kernel/shmall=65536 ...": what the supervisor, the sandbox's
# namespace root, lowers for its own namespaces before the kernel starts (supervisor/namespace_limits.py)
ENV_NAMESPACE_LIMITS: Final = "IVRALO_NAMESPACE_LIMITS"
# Set by the host when it gave bwrap the base seccomp filter (``--seccomp``): the supervisor installs it otherwise.
ENV_SECCOMP_BY_BWRAP: Final = "IVRALO_SECCOMP_BY_BWRAP"
# The closed names that are symlinks, as a JSON list: the host mounts each link over itself from
# outside (protocol/sandbox/link_mounts.py), and the supervisor starts the kernel once they are mount points.
ENV_COVER_LINKS: Final = "IVRALO_COVER_LINKS"
# Lines the host wants the kernel's banner to show (newline-separated), e.g. a workspace file ignored.
ENV_HOST_NOTES: Final = "IVRALO_HOST_NOTES"
# The sandbox setting (auto | required | off) for a raw launch, which reads no provisioner config:
# kernel.json's env carries it. The provisioner's own trait decides for jupyter_client hosts.
ENV_SANDBOX_SETTING: Final = "IVRALO_SANDBOX_SETTING"
SANDBOX_MODES: Final = ("auto", "required", "off")
# The kernel's memory cgroup (host/sandbox/memory_cgroup.py): where cgroup v2 delegates one, always, or never.
MEMORY_CGROUP_MODES: Final = ("auto", "required", "off")
# The host of a raw launch: the supervisor hands a launch with no host over to it (exec, same pid).
RAW_LAUNCH_MODULE: Final = "ivralo_kernel.host.jupyter.raw_launch"
ENV_EGRESS_SOCKET: Final = "IVRALO_EGRESS_SOCKET"  # the host's egress proxy (a unix socket in the sandbox)
# A pipe's read end whose writer only the host holds: EOF means the host process is gone (inside a
# sandbox the supervisor's parent is bwrap, which outlives the host; a thread's exit is not a death).
ENV_HOST_PIPE_FD: Final = "IVRALO_HOST_PIPE_FD"
# The kernel's end of the broker's socketpair (protocol/broker_frames.py): its requests and the host's
# answers. Only the host holds the other end.
ENV_BROKER_FD: Final = "IVRALO_BROKER_FD"
# Set by a raw launch's host (never by the kernel): it enforces the deadline as the provisioner does,
# so the supervisor takes the backstop's arming and disarming from the host's pipe alone.
ENV_HOST_ENFORCES_DEADLINE: Final = "IVRALO_HOST_ENFORCES_DEADLINE"
# A pipe's write end the host passes through bwrap: the supervisor's first act is one line on it
# (PIPE_STAGE + STAGE_SANDBOX_BUILT). EOF before that line means bwrap exited without building the
# sandbox, and the host fails the start (or falls back) at once, with bwrap's own words.
ENV_SANDBOX_UP_FD: Final = "IVRALO_SANDBOX_UP_FD"
# The host's choice of bwrap, made by the person (a path): probed like any other, and the only one tried.
ENV_BWRAP: Final = "IVRALO_BWRAP"
STAGE_SANDBOX_BUILT: Final = "sandbox built"
ENV_RELAY_PORT: Final = "IVRALO_RELAY_PORT"  # where the supervisor offers it on the sandbox's loopback
# The kernel's exchange folder for the namespace API's data plane (host-made, on tmpfs where there is
# one): the host creates each segment there; the kernel may write into and unlink what it finds.
ENV_EXCHANGE_DIR: Final = "IVRALO_EXCHANGE_DIR"
# What a namespace request the kernel refuses raises: the host tells these apart by name.
REFUSED_VALUE_ERROR: Final = "RefusedValue"
ARROW_MISSING_ERROR: Final = "ArrowMissing"
SANDBOX_BWRAP: Final = "bwrap"
# The sandbox's loopback port of the egress relay (the sandbox has its own network namespace, so a
# fixed port collides with nothing; 3128 is the port proxies are known by).
RELAY_PORT: Final = 3128
RELAY_PORT_ANY: Final = 0  # the fallback's: no network namespace, so a loopback port the OS picks
PROXY_VARIABLES: Final = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")

# The product's own database URL: always scrubbed, whatever its name says.
ENV_PRODUCT_SQL_URL: Final = "IVRALO_SQL_URL"

# Files in a workspace (and in the config home, for databases.json).
STATE_DIR: Final = ".ivralo"
WORKER_LOG: Final = ".ivralo/python-worker.log"
HISTORY_DIR: Final = ".ivralo/history"  # copies the write guard keeps (protocol/history_index.py)
DATABASES_FILE: Final = "databases.json"
DOTENV_FILE: Final = ".env"

# Start-up stage markers, in order. The kernel writes each one to the supervisor's stage pipe
# as it is reached; a kernel that dies before READY leaves the last one in the worker log.
STAGE_INTERPRETER_UP: Final = "interpreter up"
STAGE_LIMITS_APPLIED: Final = "limits applied"
STAGE_GUARDS_INSTALLED: Final = "guards installed"
STAGE_KERNEL_BUILT: Final = "kernel built"
STAGES: Final = (STAGE_INTERPRETER_UP, STAGE_LIMITS_APPLIED, STAGE_GUARDS_INSTALLED, STAGE_KERNEL_BUILT)

ROLE_SPECIALIST: Final = "specialist"
ROLE_READONLY: Final = "readonly"
ROLES: Final = (ROLE_SPECIALIST, ROLE_READONLY)

# Where an agent's Python runs: the project's interpreter and packages, or the hermetic surface
# (the standard library and ivralo's helpers only, writes to a scratch folder only).
SURFACE_PROJECT: Final = "project"
SURFACE_HERMETIC: Final = "hermetic"
SURFACES: Final = (SURFACE_PROJECT, SURFACE_HERMETIC)

# The section of kernel_info_reply that says this is an ivralo kernel and what is in force.
KERNEL_INFO_SECTION: Final = "ivralo"

# Custom control-channel message types (host -> kernel). Control is served while a cell runs.
MSG_DEADLINE_NOTICE: Final = "ivralo_deadline_notice"  # "the next interrupt is a deadline"
MSG_STATUS_REQUEST: Final = "ivralo_status_request"  # "which execution is running?"
# "I hear your IOPub and you hear my control": the host sends it once its IOPub subscription is
# live; the kernel serves no shell request and sends no broker request before it (the watchdog must
# see every execution start, and a request is bound to a running execution).
# Behind a Kernel Gateway (no shared memory), a piece of a table the host sends, as the message's
# buffer, on shell: {"ref"} (no reply; the request that binds the table comes after it on shell).
MSG_DATA_CHUNK: Final = "ivralo_data_chunk"
MSG_BROKER_HELLO: Final = "ivralo_broker_hello"  # {"comm_id"} -> ivralo_broker_hello_reply {"status"}
# What the egress proxy decided, for the cell's "hosts tried" line {"host", "port", "allowed", "reason"};
# the proxy goes on once the kernel has answered (or after a short wait).
MSG_EGRESS_NOTE: Final = "ivralo_egress_note"
CONTROL_MSG_TYPES: Final = (
    MSG_DEADLINE_NOTICE,
    MSG_STATUS_REQUEST,
    MSG_BROKER_HELLO,
    MSG_EGRESS_NOTE,
)

# What a broker request asks for (ENV_BROKER_FD says how it travels).
BROKER_EGRESS: Final = "egress"  # {"host", "port"} -> {"allowed", "reason"} (the host asks whoever it asks)
# A person's answer relayed by the kernel, as older kernels sent it: always refused (the host asks the
# person itself, on its own channel to the client; host/sandbox/stdin_questions.py).
BROKER_EGRESS_ANSWER: Final = "egress_answer"
BROKER_API: Final = "api"  # {"operation": str, "params": {...}} -> {"ok", "result" | "error", "record"}
BROKER_SQL: Final = "sql"  # {"database": str, "query": str, "params": {...}} -> the same shape
BROKER_CATALOG: Final = "catalog"  # {} -> the operations and databases this host knows (names only)
EGRESS_CHOICES: Final = ("yes", "always", "no")  # yes: for this worker's life; always: into hosts.allow

# Lines the kernel writes to the supervisor's pipe (ENV_STAGE_FD), one per line.
PIPE_STAGE: Final = "stage:"  # + stage name
# The supervisor's backstop for one execution: + "<msg_id>:<CLOCK_MONOTONIC seconds>" or "<msg_id>:off".
# Where the host enforces deadlines it writes these lines on its own pipe (ENV_HOST_PIPE_FD), and the
# kernel's may only arm one earlier: nothing the kernel process writes can disarm it.
PIPE_KILL_AT: Final = "kill-at:"
PIPE_KILL_NOW: Final = "kill-now"  # the kernel asks for its whole tree to be ended
# The supervisor's exit status when it ended the tree for a deadline (as timeout(1) does).
DEADLINE_EXIT_STATUS: Final = 124

# In the metadata of the kernel's "busy" for an execute_request: the requester's shell routing
# identity (hex), so the host can answer an execution whose kernel it had to kill.
META_REQUESTER: Final = "requester"

# Texts a caller sees (agent result, or the cell in a notebook).
INTERRUPTED_TEXT: Final = (
    "interrupted: exceeded deadline_ms={deadline_ms}; namespace preserved (partial side effects possible)"
)

# The kernel's data plane (kernel/dataplane.py), hidden in every namespace under this name: the host's
# namespace calls reach it without an import (refused on the hermetic surface and by the code gate).
DATAPLANE_NAME: Final = "_ivralo_dataplane"
