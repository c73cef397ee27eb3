from libs.db.migrate import Migration, MigrationError, apply_migrations, load_migrations
from libs.db.pool import Database

__all__ = ["Database", "Migration", "MigrationError", "apply_migrations", "load_migrations"]
