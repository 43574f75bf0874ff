"""[actions]: the rules that act on what slurmtel measures (DESIGN §11), their delivery
(e-mail, webhooks, Slurm's MailProg) and their safety limits.

The dataclasses are part of the one config object (slurmtel.config.Config.actions); they live
here, beside the code that uses them, and import nothing heavy: every command loads the config.
Validation is validate_actions(), called by slurmtel.config.

Rules mirror Job Defense Shield's alerts (an admin switching from it finds the same knobs):
its `first_warning_minutes`, `second_warning_minutes`, `cancel_minutes` and `do_not_cancel`
are warn_minutes, final_warning_minutes, cancel_minutes and cancel (false by default here);
its `excluded_users`, `partitions`, `cluster`, `max_interactive_*` are exclude_users,
partitions, clusters, exclude_interactive; its `gpu_frac_threshold` (1.0: a job with one unused
GPU is acted on) is gpus = "any"; `email-domain-name` and `external-emails` are
recipients.domain and recipients.users; `admin_emails` is to = ["admins"].
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field

from slurmtel.errors import ConfigError

# what a rule watches
KIND_NO_PROCESS = "gpus_no_process"
KIND_IDLE = "gpus_idle"
KIND_JOB_END = "job_end"
KIND_NODE_HEALTH = "node_health"
KIND_BUDGET = "budget"
KIND_MONTH_CLOSED = "month_closed"
RULE_KINDS = (KIND_NO_PROCESS, KIND_IDLE, KIND_JOB_END, KIND_NODE_HEALTH, KIND_BUDGET, KIND_MONTH_CLOSED)
# the kinds that watch running jobs' GPUs (warnings, final warning, cancellation)
GPU_KINDS = (KIND_NO_PROCESS, KIND_IDLE)
# the kinds about one user's job: exclusions apply, the owner may be told
JOB_KINDS = (KIND_NO_PROCESS, KIND_IDLE, KIND_JOB_END)

# who a rule's message goes to: these roles, or literal e-mail addresses
ROLES = ("owner", "coordinators", "pis", "admins", "finance")
EMAIL_SECURITY = ("none", "starttls", "tls")
WEBHOOK_FORMATS = ("json", "slack", "mattermost", "teams")
GPUS_MODES = ("any", "all")

_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
_ADDRESS = re.compile(r"[^@\s<>,;\"\\]+@[^@\s<>,;\"\\]+")


@dataclass(frozen=True)
class ActionRule:
    """One [[actions.rules]] table. Keys a kind does not use must keep their defaults."""

    # the rule's name: part of every record's key (rule, subject, step); lower case, - and _
    name: str = ""
    # what it watches: gpus_no_process, gpus_idle, job_end, node_health, budget, month_closed
    kind: str = ""
    enabled: bool = True
    # gpus_*: minutes a GPU has been held with no process (or idle) before the first warning,
    # the final warning and the cancellation; 0 = that step is not taken
    warn_minutes: int = 0
    final_warning_minutes: int = 0
    cancel_minutes: int = 0
    # gpus_*: cancel (scancel) at cancel_minutes; off unless set, and then only after the final
    # warning was delivered and grace_minutes passed
    cancel: bool = False
    grace_minutes: int = 15
    # gpus_*: "any" = a job with at least one such GPU; "all" = only when every GPU is
    gpus: str = "any"
    # the jobs it watches: these clusters and partitions ([] = all)
    clusters: list[str] = field(default_factory=list)
    partitions: list[str] = field(default_factory=list)
    # jobs it never acts on: users, accounts, partitions, QOS, job names (shell patterns)
    exclude_users: list[str] = field(default_factory=list)
    exclude_accounts: list[str] = field(default_factory=list)
    exclude_partitions: list[str] = field(default_factory=list)
    exclude_qos: list[str] = field(default_factory=list)
    exclude_job_names: list[str] = field(default_factory=list)
    # ... jobs whose time limit (running) or run time (ended) is shorter than this; 0 = none
    exclude_shorter_than_minutes: int = 0
    # ... interactive jobs (salloc/srun, or a name in actions.interactive_job_names)
    exclude_interactive: bool = False
    # roles ("owner", "coordinators", "pis", "admins", "finance") or e-mail addresses; [] = the
    # kind's default
    to: list[str] = field(default_factory=list)
    # [[actions.webhooks]] names that also get each message
    webhooks: list[str] = field(default_factory=list)
    # a rule that would act on more than this many jobs (nodes, accounts) in one run acts on
    # none and alerts the admins instead; 0 = no limit
    max_jobs_per_run: int = 20
    # job_end: only jobs whose owner asked for mail (Slurm's MailProg, `slurmtel mailprog`)
    only_when_asked: bool = True
    # node_health: what counts, looked at over the last lookback_hours
    lookback_hours: int = 24
    xid: bool = True
    ecc: bool = True
    # ... a node on which at least min_attempts ran and this share of them failed
    failed_share: float = 0.5
    min_attempts: int = 4
    drift: bool = True
    nccl: bool = True
    # budget: the shares of the period's budget that are told, each once a period
    thresholds_share: list[float] = field(default_factory=lambda: [0.8, 1.0])


def default_rules() -> list[ActionRule]:
    """The shipped rules (used while [[actions.rules]] names none)."""
    return [
        ActionRule(name="no-process-gpus", kind=KIND_NO_PROCESS, warn_minutes=30),
        ActionRule(
            name="idle-gpus",
            kind=KIND_IDLE,
            warn_minutes=60,
            final_warning_minutes=105,
            cancel_minutes=120,
            exclude_interactive=True,
        ),
        ActionRule(name="job-end-summary", kind=KIND_JOB_END, max_jobs_per_run=500),
        ActionRule(name="node-health", kind=KIND_NODE_HEALTH),
        ActionRule(name="budgets", kind=KIND_BUDGET),
        ActionRule(name="statements", kind=KIND_MONTH_CLOSED, max_jobs_per_run=0),
    ]


# who a kind tells when its rule says nothing
DEFAULT_TO: dict[str, tuple[str, ...]] = {
    KIND_NO_PROCESS: ("owner",),
    KIND_IDLE: ("owner",),
    KIND_JOB_END: ("owner",),
    KIND_NODE_HEALTH: ("admins",),
    KIND_BUDGET: ("coordinators", "finance"),
    KIND_MONTH_CLOSED: ("coordinators", "pis"),
}


@dataclass(frozen=True)
class RecipientsConfig:
    """[actions.recipients]: who "owner", "coordinators", "pis", "admins" and "finance" are."""

    # a user's address is user@domain ("" = users have no address unless listed in users)
    domain: str = ""
    # user -> address, winning over domain (users who read mail elsewhere)
    users: dict[str, str] = field(default_factory=dict)
    # account -> addresses of its PIs ("pis"; a month's statement goes to them)
    pis: dict[str, list[str]] = field(default_factory=dict)
    # "admins" and "finance": addresses
    admins: list[str] = field(default_factory=list)
    finance: list[str] = field(default_factory=list)
    # "coordinators": the account's sacctmgr coordinators (access.sacctmgr_command), each at
    # their user address
    coordinators: bool = True


@dataclass(frozen=True)
class EmailConfig:
    """[actions.email]: SMTP."""

    smtp_host: str = "localhost"
    smtp_port: int = 25
    # "none", "starttls" (upgrade a plain connection) or "tls" (TLS from the start, port 465)
    security: str = "none"
    # CA certificates (PEM) the server's certificate is checked with; "" = the system's
    ca_file: str = ""
    # SMTP AUTH: user name, and a file holding the password ("" = no AUTH)
    username: str = ""
    password_file: str = ""
    # From: and Reply-To: ("" = no Reply-To)
    sender: str = "slurmtel@localhost"
    reply_to: str = ""
    # put before every subject
    subject_prefix: str = "[slurmtel] "
    timeout_seconds: int = 30


@dataclass(frozen=True)
class WebhookConfig:
    """One [[actions.webhooks]] table: an HTTP(S) endpoint that gets messages as JSON."""

    # what rules name it by (their webhooks key)
    name: str = ""
    url: str = ""
    # "json" (the record: rule, step, job, figures, text), or a chat text payload: "slack",
    # "mattermost" ({"text": ...}) or "teams" (a MessageCard)
    format: str = "json"
    # a file holding a bearer token, sent as "Authorization: Bearer <token>"; "" = none
    token_file: str = ""
    ca_file: str = ""
    timeout_seconds: int = 10


@dataclass(frozen=True)
class MailProgConfig:
    """[actions.mailprog]: `slurmtel mailprog` as slurm.conf's MailProg."""

    # the mail program Slurm's other mails (job began, ...) are handed to, as Slurm calls it
    fallback_command: str = "/usr/bin/mail"
    # a job-end summary waits this long for the job's accounting record and telemetry; then
    # it is sent with what there is
    wait_seconds: int = 1800


@dataclass(frozen=True)
class ActionsConfig:
    """[actions]: rules, delivery and limits (docs/actions.md)."""

    # the daemon evaluates the rules after each attribution run (`act --dry-run` works either way)
    enabled: bool = False
    # a TOML file of [[rules]] tables used instead of [[actions.rules]]; "" = none
    rules_file: str = ""
    # messages link to {base_url}/jobs/<id> when set; "" = no link
    base_url: str = ""
    # a GPU is idle in a window when its utilisation is below the idle threshold and its
    # memory use stays at or below this
    idle_memory_max_bytes: int = 1073741824
    # a GPU whose newest window ended longer ago than this is not measured now: nothing acts on it
    telemetry_max_age_seconds: int = 900
    # job names (shell patterns) that mark a job interactive, besides salloc/srun submissions
    interactive_job_names: list[str] = field(default_factory=lambda: ["interactive", "sys/dashboard*"])
    # a directory of templates; a file named like a shipped one replaces it; "" = shipped only
    templates_dir: str = ""
    # a failed delivery is tried again after retry_backoff_seconds x 2^(tries-1), at most
    # retry_backoff_max_seconds, and given up after retry_max_attempts tries
    retry_backoff_seconds: int = 60
    retry_backoff_max_seconds: int = 3600
    retry_max_attempts: int = 10
    # cancels a job: the job id is added as the last argument
    scancel_command: str = "scancel"
    # scancel and the job state check before it (squeue, sources.slurmctld.squeue_command)
    command_timeout_seconds: int = 30
    recipients: RecipientsConfig = field(default_factory=RecipientsConfig)
    email: EmailConfig = field(default_factory=EmailConfig)
    webhooks: list[WebhookConfig] = field(default_factory=list)
    mailprog: MailProgConfig = field(default_factory=MailProgConfig)
    rules: list[ActionRule] = field(default_factory=default_rules)


# ---------------------------------------------------------------- validation


def _check_address(value: str, key: str) -> None:
    if not _ADDRESS.fullmatch(value):
        raise ConfigError(f"{key}: '{value}' is not an e-mail address")


def _is_address(value: str) -> bool:
    return "@" in value


def validate_rule(rule: ActionRule, key: str, webhooks: set[str]) -> None:
    if not _NAME.fullmatch(rule.name):
        raise ConfigError(f"{key}.name must be lower-case letters, digits, - and _ (not '{rule.name}')")
    if rule.kind not in RULE_KINDS:
        raise ConfigError(f"{key}.kind must be one of {', '.join(RULE_KINDS)}, not '{rule.kind}'")
    defaults = ActionRule()
    for name in (
        "warn_minutes",
        "final_warning_minutes",
        "cancel_minutes",
        "grace_minutes",
        "exclude_shorter_than_minutes",
        "max_jobs_per_run",
        "lookback_hours",
        "min_attempts",
    ):
        if getattr(rule, name) < 0:
            raise ConfigError(f"{key}.{name} must not be negative")
    gpu_keys = ("warn_minutes", "final_warning_minutes", "cancel_minutes", "cancel", "grace_minutes", "gpus")
    if rule.kind in GPU_KINDS:
        steps = [m for m in (rule.warn_minutes, rule.final_warning_minutes, rule.cancel_minutes) if m]
        if not steps:
            raise ConfigError(f"{key}: set warn_minutes, final_warning_minutes or cancel_minutes")
        if steps != sorted(set(steps)):
            raise ConfigError(
                f"{key}: warn_minutes < final_warning_minutes < cancel_minutes (each where set)"
            )
        if rule.gpus not in GPUS_MODES:
            raise ConfigError(f"{key}.gpus must be 'any' or 'all', not '{rule.gpus}'")
        if rule.cancel:
            if not rule.cancel_minutes or not rule.final_warning_minutes:
                raise ConfigError(
                    f"{key}: cancel = true needs final_warning_minutes and cancel_minutes "
                    "(a job is cancelled only after its final warning was delivered)"
                )
            if "owner" not in (rule.to or DEFAULT_TO[rule.kind]):
                raise ConfigError(f"{key}: cancel = true needs the owner among its recipients ('to')")
            if rule.grace_minutes < 1:
                raise ConfigError(f"{key}.grace_minutes must be at least 1 with cancel = true")
    else:
        for name in gpu_keys:
            if getattr(rule, name) != getattr(defaults, name):
                raise ConfigError(f"{key}.{name} applies only to the gpus_no_process and gpus_idle kinds")
    if rule.kind not in JOB_KINDS:
        for name in (
            "clusters",
            "partitions",
            "exclude_users",
            "exclude_accounts",
            "exclude_partitions",
            "exclude_qos",
            "exclude_job_names",
            "exclude_shorter_than_minutes",
            "exclude_interactive",
        ):
            if getattr(rule, name) != getattr(defaults, name):
                raise ConfigError(f"{key}.{name} applies only to the job kinds ({', '.join(JOB_KINDS)})")
    if rule.kind != KIND_JOB_END and rule.only_when_asked != defaults.only_when_asked:
        raise ConfigError(f"{key}.only_when_asked applies only to the job_end kind")
    if rule.kind != KIND_NODE_HEALTH:
        for name in ("lookback_hours", "xid", "ecc", "failed_share", "min_attempts", "drift", "nccl"):
            if getattr(rule, name) != getattr(defaults, name):
                raise ConfigError(f"{key}.{name} applies only to the node_health kind")
    elif not 0 < rule.failed_share <= 1:
        raise ConfigError(f"{key}.failed_share must be in (0, 1]")
    elif rule.lookback_hours < 1:
        raise ConfigError(f"{key}.lookback_hours must be at least 1")
    if rule.kind != KIND_BUDGET:
        if rule.thresholds_share != defaults.thresholds_share:
            raise ConfigError(f"{key}.thresholds_share applies only to the budget kind")
    elif not rule.thresholds_share or any(not 0 < s <= 10 for s in rule.thresholds_share):
        raise ConfigError(f"{key}.thresholds_share must list shares of the budget, such as 0.8 and 1.0")
    for pattern in rule.exclude_job_names:
        if not pattern:
            raise ConfigError(f"{key}.exclude_job_names holds an empty pattern")
        fnmatch.translate(pattern)
    for target in rule.to:
        if _is_address(target):
            _check_address(target, f"{key}.to")
        elif target not in ROLES:
            raise ConfigError(
                f"{key}.to: '{target}' is neither an e-mail address nor a role ({', '.join(ROLES)})"
            )
        elif target == "owner" and rule.kind not in JOB_KINDS:
            raise ConfigError(f"{key}.to: a {rule.kind} rule has no owner to tell")
    for name in rule.webhooks:
        if name not in webhooks:
            raise ConfigError(f"{key}.webhooks: no [[actions.webhooks]] is named '{name}'")


def validate_actions(actions: ActionsConfig, rules: list[ActionRule] | None = None) -> None:
    """Check [actions] and its rules (RULES: those of rules_file, when it names one)."""
    for name in (
        "idle_memory_max_bytes",
        "telemetry_max_age_seconds",
        "retry_backoff_seconds",
        "retry_backoff_max_seconds",
        "retry_max_attempts",
        "command_timeout_seconds",
    ):
        if getattr(actions, name) <= 0:
            raise ConfigError(f"actions.{name} must be positive")
    if actions.retry_backoff_max_seconds < actions.retry_backoff_seconds:
        raise ConfigError("actions.retry_backoff_max_seconds must be at least actions.retry_backoff_seconds")
    if actions.base_url and not re.match(r"https?://[^/?#\s]+", actions.base_url):
        raise ConfigError(f"actions.base_url must be an http:// or https:// URL, not '{actions.base_url}'")
    if not actions.scancel_command.strip():
        raise ConfigError("actions.scancel_command must not be empty")
    recipients = actions.recipients
    if recipients.domain and not re.fullmatch(r"[A-Za-z0-9.-]+\.[A-Za-z0-9-]+", recipients.domain):
        raise ConfigError(f"actions.recipients.domain is not a mail domain: '{recipients.domain}'")
    for user, address in recipients.users.items():
        _check_address(address, f"actions.recipients.users.{user}")
    for account, addresses in recipients.pis.items():
        for address in addresses:
            _check_address(address, f"actions.recipients.pis.{account}")
    for role in ("admins", "finance"):
        for address in getattr(recipients, role):
            _check_address(address, f"actions.recipients.{role}")
    email = actions.email
    if email.security not in EMAIL_SECURITY:
        raise ConfigError(
            f"actions.email.security must be 'none', 'starttls' or 'tls', not '{email.security}'"
        )
    if not 0 < email.smtp_port <= 65535:
        raise ConfigError("actions.email.smtp_port must be between 1 and 65535")
    if email.timeout_seconds <= 0:
        raise ConfigError("actions.email.timeout_seconds must be positive")
    if bool(email.username) != bool(email.password_file):
        raise ConfigError("actions.email.username and actions.email.password_file go together")
    _check_address(email.sender, "actions.email.sender")
    if email.reply_to:
        _check_address(email.reply_to, "actions.email.reply_to")
    if re.search(r"[\r\n]", email.subject_prefix):
        raise ConfigError("actions.email.subject_prefix must be one line")
    names: set[str] = set()
    for i, hook in enumerate(actions.webhooks):
        key = f"actions.webhooks[{i}]"
        if not _NAME.fullmatch(hook.name):
            raise ConfigError(f"{key}.name must be lower-case letters, digits, - and _ (not '{hook.name}')")
        if hook.name in names:
            raise ConfigError(f"{key}.name: another webhook is named '{hook.name}'")
        names.add(hook.name)
        if not re.match(r"https?://[^/?#\s]+", hook.url):
            raise ConfigError(f"{key}.url must be an http:// or https:// URL")
        if re.match(r"https?://[^/?#]*@", hook.url):
            raise ConfigError(f"{key}.url must not hold credentials: put a token in {key}.token_file")
        if hook.format not in WEBHOOK_FORMATS:
            raise ConfigError(
                f"{key}.format must be one of {', '.join(WEBHOOK_FORMATS)}, not '{hook.format}'"
            )
        if hook.timeout_seconds <= 0:
            raise ConfigError(f"{key}.timeout_seconds must be positive")
    if actions.mailprog.wait_seconds < 0:
        raise ConfigError("actions.mailprog.wait_seconds must not be negative")
    for i, pattern in enumerate(actions.interactive_job_names):
        if not pattern:
            raise ConfigError(f"actions.interactive_job_names[{i}] is empty")
    checked = actions.rules if rules is None else rules
    where = "actions.rules" if rules is None else f"{actions.rules_file}: rules"
    seen: set[str] = set()
    for i, rule in enumerate(checked):
        key = f"{where}[{i}]"
        validate_rule(rule, key, names)
        if rule.name in seen:
            raise ConfigError(f"{key}.name: another rule is named '{rule.name}'")
        seen.add(rule.name)
