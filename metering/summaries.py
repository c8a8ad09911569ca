"""The ledger's summary tables (``LedgerDay``, ``LedgerJobMonth``), kept by a database trigger.

A trigger, not Python: every row the ledger gains (accrual, final, adjustment, a bulk load, raw
SQL) adds to its day and its job-month in the same transaction, and a row skipped by ON CONFLICT
DO NOTHING adds nothing, so a summary never differs from the sum of the rows it stands for.
Writers hold a per-team advisory lock, taken in team order, while they insert
(``common.ledger_locks``), so two transactions never wait on each other's summary rows
in a cycle. ``rebuild_sql`` fills the tables from the rows (the migration, a bulk load);
``drift_sql`` finds any summary that no longer equals its rows (a trigger dropped or bypassed).
"""

LEDGER = "metering_meterentry"
DAY, JOB_MONTH = "metering_ledgerday", "metering_ledgerjobmonth"
TRIGGER = "metering_ledger_summaries"

# The UTC day and month of a period, and the row's GPU-microseconds, per backend. SQLite keeps a
# UTC timestamp as 'YYYY-MM-DD HH:MM:SS[.ffffff]' text.
_EXPR = {
    "postgresql": {
        "day": "({row}.period_start AT TIME ZONE 'UTC')::date",
        "month": "date_trunc('month', {row}.period_start AT TIME ZONE 'UTC')::date",
        "amount": "{row}.gpus::bigint * {row}.microseconds",
    },
    "sqlite": {
        "day": "substr({row}.period_start, 1, 10)",
        "month": "substr({row}.period_start, 1, 7) || '-01'",
        "amount": "{row}.gpus * {row}.microseconds",
    },
}


def _expr(vendor: str, row: str) -> dict[str, str]:
    try:
        return {key: value.format(row=row) for key, value in _EXPR[vendor].items()}
    except KeyError:
        raise RuntimeError(f"no ledger summary trigger for the {vendor} backend") from None


def _upserts(vendor: str) -> str:
    e = _expr(vendor, "NEW")
    adjusted = f"CASE WHEN NEW.kind = 'adjustment' THEN {e['amount']} ELSE 0 END"
    metered = f"CASE WHEN NEW.kind = 'adjustment' THEN 0 ELSE {e['amount']} END"
    return f"""
        INSERT INTO {DAY} (team_id, day, gpu_micros, rows) VALUES (NEW.team_id, {e["day"]}, {e["amount"]}, 1)
        ON CONFLICT (team_id, day) DO UPDATE
            SET gpu_micros = {DAY}.gpu_micros + excluded.gpu_micros, rows = {DAY}.rows + 1;
        INSERT INTO {JOB_MONTH} (team_id, job_id, month, metered, adjusted)
            VALUES (NEW.team_id, NEW.job_id, {e["month"]}, {metered}, {adjusted})
        ON CONFLICT (job_id, month) DO UPDATE
            SET metered = {JOB_MONTH}.metered + excluded.metered, adjusted = {JOB_MONTH}.adjusted + excluded.adjusted;
    """


def install_sql(vendor: str) -> list[str]:
    if vendor == "postgresql":
        return [
            f"CREATE OR REPLACE FUNCTION {TRIGGER}() RETURNS trigger AS $$ BEGIN {_upserts(vendor)} "
            "RETURN NULL; END; $$ LANGUAGE plpgsql",
            f"CREATE TRIGGER {TRIGGER} AFTER INSERT ON {LEDGER} FOR EACH ROW EXECUTE FUNCTION {TRIGGER}()",
        ]
    return [f"CREATE TRIGGER IF NOT EXISTS {TRIGGER} AFTER INSERT ON {LEDGER} BEGIN {_upserts(vendor)} END"]


def remove_sql(vendor: str) -> list[str]:
    if vendor == "postgresql":
        return [f"DROP TRIGGER IF EXISTS {TRIGGER} ON {LEDGER}", f"DROP FUNCTION IF EXISTS {TRIGGER}()"]
    return [f"DROP TRIGGER IF EXISTS {TRIGGER}"]


def _sums_sql(vendor: str) -> dict[str, str]:
    """Each summary table's rows as the ledger's rows add up to, in the table's column order."""
    e = _expr(vendor, "r")
    return {
        DAY: f"SELECT r.team_id, {e['day']}, SUM({e['amount']}), COUNT(*) FROM {LEDGER} r "
        f"GROUP BY r.team_id, {e['day']}",
        JOB_MONTH: f"SELECT r.team_id, r.job_id, {e['month']}, "
        f"SUM(CASE WHEN r.kind = 'adjustment' THEN 0 ELSE {e['amount']} END), "
        f"SUM(CASE WHEN r.kind = 'adjustment' THEN {e['amount']} ELSE 0 END) "
        f"FROM {LEDGER} r GROUP BY r.team_id, r.job_id, {e['month']}",
    }


COLUMNS = {DAY: "team_id, day, gpu_micros, rows", JOB_MONTH: "team_id, job_id, month, metered, adjusted"}
KEYS = {DAY: "team_id, day", JOB_MONTH: "job_id, month"}


def rebuild_sql(vendor: str) -> list[str]:
    """Empties both tables and sums them again from every ledger row."""
    sums = _sums_sql(vendor)
    return [f"DELETE FROM {DAY}", f"DELETE FROM {JOB_MONTH}"] + [
        f"INSERT INTO {table} ({COLUMNS[table]}) {sums[table]}" for table in (DAY, JOB_MONTH)
    ]


def drift_sql(vendor: str) -> list[tuple[str, str]]:
    """Per summary table, a query for the keys whose summary row differs from its rows' sums (or is missing, or extra)."""
    sums = _sums_sql(vendor)
    queries = []
    for table in (DAY, JOB_MONTH):
        kept = f"SELECT {COLUMNS[table]} FROM {table}"
        differing = f"SELECT * FROM ({kept} EXCEPT {sums[table]}) a UNION SELECT * FROM ({sums[table]} EXCEPT {kept}) b"
        queries.append((table, f"SELECT DISTINCT {KEYS[table]} FROM ({differing}) d ORDER BY {KEYS[table]}"))
    return queries
