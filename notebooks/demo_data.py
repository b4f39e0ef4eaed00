"""Make the demo's embedded database (SQLite): the tour queries it through the credential broker.

Usage: python notebooks/demo_data.py DB_FILE CONFIG_HOME
Writes DB_FILE (a small shop) and CONFIG_HOME/databases.json naming it by the variable
DEMO_SHOP_DB_URL, which `make demo` sets in the host's environment only. The entry is the config
home's, not the workspace's: a SQLite file outside the workspace may be named only there (the
workspace's databases.json is the kernel's to write).
"""

import json
import sqlite3
import sys
from pathlib import Path

ITEMS = [("tea", 3.5), ("coffee", 4.2), ("scone", 2.8), ("cake", 5.9), ("juice", 3.1), ("bagel", 2.2)]


def main(db_file: str, config_home: str) -> None:
    path = Path(db_file)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    with sqlite3.connect(path) as db:
        db.execute("create table items (name text primary key, price real)")
        db.executemany("insert into items values (?, ?)", ITEMS)
    databases = {"shop": {"url_env": "DEMO_SHOP_DB_URL", "read_only": True}}
    Path(config_home).mkdir(parents=True, exist_ok=True)
    Path(config_home, "databases.json").write_text(json.dumps(databases, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
