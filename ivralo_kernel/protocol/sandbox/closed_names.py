"""[protocol] The names that stay closed in a workspace even when they do not exist yet, and why.

Shared by the host, which mounts them read-only in the sandbox (a placeholder for each missing one:
``host/sandbox/closed_paths.py``), and the kernel's write guard, which refuses them with a sentence.
"""

from __future__ import annotations

DIR, FILE = "dir", "file"

# What other tools run or read by themselves when the person next opens the workspace, with why.
# Every one is a directory placeholder when missing: git ignores an empty directory (it is never
# untracked, never committed), and so do editors; a file there would show in `git status`.
TOOL_FILES: dict[str, str] = {
    ".vscode": "VS Code: tasks.json runs on folderOpen; settings.json picks the interpreter, terminal env",
    ".idea": "JetBrains IDEs: run configurations and startup tasks",
    ".claude": "Claude Code: settings.json hooks run commands; commands/ and agents/ are prompts it trusts",
    ".cursor": "Cursor: rules and mcp.json (commands it starts)",
    ".gemini": "Gemini CLI: settings.json's mcpServers are commands it starts",
    ".windsurf": "Windsurf: rules and workflows it follows",
    ".continue": "Continue: config and MCP servers (commands it starts)",
    ".zed": "Zed: tasks.json and settings (language servers it starts)",
    ".devcontainer": "Dev Containers: postCreateCommand and friends run when the folder is opened",
    ".github": "GitHub: workflows run in CI with the repository's secrets",
    ".gitlab-ci.yml": "GitLab: the CI pipeline, run with the project's secrets",
    ".husky": "husky: git hooks (core.hooksPath) that run at the person's next commit",
    ".githooks": "a common core.hooksPath: git hooks",
    ".mcp.json": "Claude Code and other MCP clients: the servers (commands) a project starts",
    ".envrc": "direnv: run by the person's shell when it enters the folder",
    ".mise.toml": "mise: env and tasks (_.source runs a script) when the person's shell enters the folder",
    ".gitmodules": "git: submodule URLs and paths, fetched by the person's next clone or update",
    ".gitconfig": "git: read where the workspace is the home folder or is included",
    ".pre-commit-config.yaml": "pre-commit: the commands run at the person's next commit",
    ".npmrc": "npm: node-options, script-shell and the registry of the person's next npm run",
    ".yarnrc.yml": "yarn: yarnPath is the program the person's next yarn runs",
}
TOOL_FILES_DEFAULT = tuple(TOOL_FILES)

# With the workspace holding the home folder, each of these is closed even when it is missing (the
# ones that exist are closed anyway: every dot-entry of the home folder). Files where a person's shell
# or git would complain about a directory get a file placeholder that does what no file did.
BASH_LOGIN_FALLBACK = (
    'if [ -r "$HOME/.bash_login" ]; then . "$HOME/.bash_login"; '
    'elif [ -r "$HOME/.profile" ]; then . "$HOME/.profile"; fi\n'
)
HOME_FILES: dict[str, tuple[str, str, str]] = {  # name: (kind, content, why)
    ".ssh": (DIR, "", "sshd reads authorized_keys and rc; ssh reads config (ProxyCommand)"),
    ".local": (DIR, "", ".local/bin is on PATH; .local/share/applications and autostart entries run"),
    ".config": (DIR, "", "autostart, systemd user units, git, fish and most tools' configuration"),
    ".cache": (DIR, "", "tools trust what they cached (wheels, compiled code)"),
    ".gnupg": (DIR, "", "gpg.conf and gpg-agent.conf name programs gpg runs"),
    ".aws": (DIR, "", "config's credential_process is a command the AWS CLI runs"),
    ".kube": (DIR, "", "kubeconfig's exec plugins are commands kubectl runs"),
    ".docker": (DIR, "", "config.json's credsStore names a program docker runs"),
    ".cargo": (DIR, "", ".cargo/bin is on PATH"),
    ".jupyter": (DIR, "", "jupyter_*_config.py runs at the next JupyterLab start"),
    ".ipython": (DIR, "", "profile startup scripts run in the next IPython"),
    ".vim": (DIR, "", "plugins run in the next vim"),
    ".emacs.d": (DIR, "", "init.el runs in the next Emacs"),
    ".vscode": (DIR, "", "VS Code's user extensions folder"),
    ".claude": (DIR, "", "Claude Code's user settings (hooks)"),
    ".bashrc": (FILE, "", "run by every interactive bash"),
    ".bash_profile": (FILE, BASH_LOGIN_FALLBACK, "run by login bash, which then skips .bash_login and .profile"),
    ".bash_login": (FILE, '[ -r "$HOME/.profile" ] && . "$HOME/.profile"\n', "run by login bash, before .profile"),
    ".bash_logout": (FILE, "", "run when a login bash ends"),
    ".profile": (FILE, "", "run by login shells"),
    ".zshenv": (FILE, "", "run by every zsh"),
    ".zprofile": (FILE, "", "run by login zsh"),
    ".zshrc": (FILE, "", "run by every interactive zsh"),
    ".zlogin": (FILE, "", "run by login zsh"),
    ".zlogout": (FILE, "", "run when a login zsh ends"),
    ".inputrc": (FILE, "$include /etc/inputrc\n", "readline key bindings can type commands into the shell"),
    ".gitconfig": (FILE, "", "git's global configuration: core.fsmonitor, aliases, hooksPath"),
    ".vimrc": (FILE, "", "run by the next vim"),
    ".emacs": (FILE, "", "run by the next Emacs"),
    ".tmux.conf": (FILE, "", "run-shell lines run at the next tmux start"),
    ".npmrc": (FILE, "", "npm's node-options and script-shell"),
    ".pypirc": (FILE, "", "where twine uploads, with which credentials"),
    ".netrc": (FILE, "", "credentials curl, git and pip send"),
    ".Rprofile": (FILE, "", "run by the next R"),
    ".psqlrc": (FILE, "", "run by the next psql (\\! runs a shell command)"),
    ".xprofile": (FILE, "", "run by the next graphical session"),
    ".xsessionrc": (FILE, "", "run by the next graphical session"),
    ".pam_environment": (FILE, "", "environment variables of the next login"),
}
