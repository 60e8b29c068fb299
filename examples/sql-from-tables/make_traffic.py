"""A narrow workload for `draftsmith tune`: write a SQL query for a described table.

Every request names one table, its columns and types, and asks for one query (a filter, a sort, an
aggregate, a group-by or a top-N), in a handful of phrasings. Tables, columns and values are drawn
from the lists below with a fixed seed, so the file is the same on every machine. None of these
requests is in the data the shipped speculators were trained on (ShareGPT, HumanEval, standard
library code).

    python examples/sql-from-tables/make_traffic.py --num 300 --out traffic.jsonl
"""

from __future__ import annotations

import random

from draftsmith.tune.split import traffic_main

TABLES = {
    "orders": [("order_id", "INTEGER"), ("customer_name", "TEXT"), ("amount", "REAL"), ("status", "TEXT"),
               ("created_at", "DATE"), ("country", "TEXT")],
    "employees": [("employee_id", "INTEGER"), ("full_name", "TEXT"), ("department", "TEXT"),
                  ("salary", "REAL"), ("hire_date", "DATE"), ("manager_id", "INTEGER")],
    "products": [("product_id", "INTEGER"), ("name", "TEXT"), ("category", "TEXT"), ("price", "REAL"),
                 ("stock", "INTEGER"), ("supplier", "TEXT")],
    "students": [("student_id", "INTEGER"), ("name", "TEXT"), ("grade", "INTEGER"), ("score", "REAL"),
                 ("city", "TEXT"), ("enrolled_on", "DATE")],
    "flights": [("flight_id", "INTEGER"), ("origin", "TEXT"), ("destination", "TEXT"),
                ("departure", "DATE"), ("seats", "INTEGER"), ("fare", "REAL")],
    "patients": [("patient_id", "INTEGER"), ("name", "TEXT"), ("age", "INTEGER"), ("ward", "TEXT"),
                 ("admitted_on", "DATE"), ("bill", "REAL")],
    "books": [("book_id", "INTEGER"), ("title", "TEXT"), ("author", "TEXT"), ("genre", "TEXT"),
              ("pages", "INTEGER"), ("published_year", "INTEGER")],
    "rentals": [("rental_id", "INTEGER"), ("customer", "TEXT"), ("car_model", "TEXT"), ("days", "INTEGER"),
                ("total", "REAL"), ("start_date", "DATE")],
}  # fmt: skip
TEXT_VALUES = ["'shipped'", "'Sales'", "'Berlin'", "'Fantasy'", "'Paris'", "'pending'", "'Oslo'", "'Toys'",
               "'Cardiology'", "'Engineering'", "'Madrid'", "'Science'", "'Tesla Model 3'", "'Canada'"]  # fmt: skip
INTRO = [
    "Table `{t}` has columns: {cols}.",
    "I have a table named {t} with the columns {cols}.",
    "Schema: {t}({cols}).",
    "Consider the SQL table {t} ({cols}).",
]
ASK = ["Write a SQL query that {q}.", "Give me the SQL to {q2}.", "How do I write a query that {q}?"]


def question(rng: random.Random, table: str, cols: list[tuple[str, str]]) -> tuple[str, str]:
    """(third-person phrasing, imperative phrasing) of one query over the table."""
    num = [c for c, t in cols if t in ("REAL", "INTEGER") and not c.endswith("_id")]
    text = [c for c, t in cols if t == "TEXT"]
    date = [c for c, t in cols if t == "DATE"]
    kind = rng.choice(["filter", "sort", "aggregate", "group", "top"])
    a, b = rng.sample([c for c, _ in cols], 2)
    n, tx = rng.choice(num), rng.choice(text)
    v = rng.choice([10, 25, 50, 100, 250, 500, 1000, 2020])
    if kind == "filter":
        s = f"returns the {a} and {b} of all rows where {n} is greater than {v}"
        return s, f"get the {a} and {b} of all rows where {n} is greater than {v}"
    if kind == "sort":
        d = rng.choice(date or num)
        return (f"lists every {tx} ordered by {d} from newest to oldest",
                f"list every {tx} ordered by {d} from newest to oldest")  # fmt: skip
    if kind == "aggregate":
        f = rng.choice(["average", "total", "maximum", "minimum"])
        w = rng.choice(TEXT_VALUES)
        return (f"computes the {f} {n} for rows whose {tx} is {w}",
                f"compute the {f} {n} for rows whose {tx} is {w}")  # fmt: skip
    if kind == "group":
        return (f"counts the rows and sums {n} for each {tx}",
                f"count the rows and sum {n} for each {tx}")  # fmt: skip
    k = rng.choice([3, 5, 10])
    return f"returns the {k} rows with the highest {n} in {table}", f"find the {k} rows with the highest {n}"


def request(rng: random.Random) -> str:
    table = rng.choice(list(TABLES))
    cols = TABLES[table]
    listed = ", ".join(f"{c} ({t})" for c, t in cols)
    q, q2 = question(rng, table, cols)
    return rng.choice(INTRO).format(t=table, cols=listed) + " " + rng.choice(ASK).format(q=q, q2=q2)


if __name__ == "__main__":
    traffic_main(__doc__.splitlines()[0], request, "sql")
