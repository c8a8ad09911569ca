"""The ledger's summary tables (``LedgerDay``, ``LedgerJobMonth``), kept by a database trigger.

A trigger, not Python: every row the ledger gains (accrual, final, adjustment, a bulk load, raw
SQL) adds to its day and its job-month in the same transaction, and a row skipped by ON CONFLICT
DO NOTHING adds nothing, so a summary never differs from the sum of the rows it stands for.
Writers insert rows ordered by (team, period), so two transactions take the summary rows' locks
in the same order. ``rebuild_sql`` fills the tables from the rows (the migration, a bulk load).
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


def rebuild_sql(vendor: str) -> list[str]:
    """Empties both tables and sums them again from every ledger row."""
    e = _expr(vendor, "r")
    return [
        f"DELETE FROM {DAY}",
        f"DELETE FROM {JOB_MONTH}",
        f"INSERT INTO {DAY} (team_id, day, gpu_micros, rows) SELECT r.team_id, {e['day']}, "
        f"SUM({e['amount']}), COUNT(*) FROM {LEDGER} r GROUP BY r.team_id, {e['day']}",
        f"INSERT INTO {JOB_MONTH} (team_id, job_id, month, metered, adjusted) SELECT r.team_id, r.job_id, "
        f"{e['month']}, SUM(CASE WHEN r.kind = 'adjustment' THEN 0 ELSE {e['amount']} END), "
        f"SUM(CASE WHEN r.kind = 'adjustment' THEN {e['amount']} ELSE 0 END) "
        f"FROM {LEDGER} r GROUP BY r.team_id, r.job_id, {e['month']}",
    ]
