from libs.db.migrate import Migration, MigrationError, apply_migrations, load_migrations
from libs.db.pool import ALL_TENANTS, Database, act_as, rowcount
from libs.db.roles import APP_ROLE, RoleError

__all__ = ["ALL_TENANTS", "APP_ROLE", "Database", "Migration", "MigrationError", "RoleError", "act_as",
           "apply_migrations", "load_migrations", "rowcount"]
