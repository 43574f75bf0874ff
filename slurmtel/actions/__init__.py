"""Acting on what slurmtel measures (DESIGN §11): rules, their messages and actions.

- settings: the [actions] config (part of slurmtel.config.Config);
- figures: every figure a message shows, declared once with the column it comes from;
- rules: what each rule decides now (reads only);
- render: the messages, from Jinja2 templates (templates/);
- recipients: roles to addresses;
- deliver: SMTP, webhooks, scancel, exactly once;
- cycle: one round (lease, evaluate, record, deliver) for the daemon and `slurmtel act`;
- mailprog: Slurm's MailProg;
- metrics: the daemon's slurmtel_action_* metrics and the node/job gauges of config/alerts/.

This package's __init__ imports nothing: every command loads slurmtel.config, which imports
settings.
"""
