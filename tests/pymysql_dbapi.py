"""A small DB-API 2.0 program over PyMySQL against a Shoal SQL node (run by tests/pymysql.rs).

Usage: python3 pymysql_dbapi.py HOST PORT. Exits non-zero (with the failed assertion) on any
difference from what MySQL would do here.
"""

import datetime
import sys
from decimal import Decimal

import pymysql
import pymysql.cursors


def expect_error(cur, sql, exc_type, code, args=None):
    """Runs sql, which must fail with exc_type and MySQL error number code."""
    try:
        cur.execute(sql, args)
    except exc_type as e:
        assert e.args[0] == code, f"{sql}: error {e.args!r}, expected {code}"
        return
    raise AssertionError(f"{sql}: no error, expected {exc_type.__name__} {code}")


def main():
    host, port = sys.argv[1], int(sys.argv[2])
    conn = pymysql.connect(host=host, port=port, user="root", password="", autocommit=True, connect_timeout=10)
    assert conn.get_server_info().endswith("-shoal"), conn.get_server_info()
    cur = conn.cursor()

    cur.execute("CREATE DATABASE pydb")
    conn.select_db("pydb")
    cur.execute(
        "CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(20) NOT NULL, price DECIMAL(8,2), added DATE)"
    )

    # Parameters: PyMySQL quotes and escapes them on the client.
    n = cur.execute(
        "INSERT INTO items VALUES (%s, %s, %s, %s)", (1, "it's \\ \"quoted\"", Decimal("9.99"), datetime.date(2024, 1, 2))
    )
    assert n == 1 and cur.rowcount == 1
    cur.executemany("INSERT INTO items (id, name) VALUES (%s, %s)", [(2, "b"), (3, "c")])
    assert cur.rowcount == 2, cur.rowcount
    cur.execute("SELECT id, name, price, added FROM items WHERE id = %(id)s", {"id": 1})
    assert cur.fetchone() == (1, "it's \\ \"quoted\"", Decimal("9.99"), datetime.date(2024, 1, 2))
    assert [d[0] for d in cur.description] == ["id", "name", "price", "added"]

    with conn.cursor(pymysql.cursors.DictCursor) as dc:
        dc.execute("SELECT id, name FROM items WHERE price IS NULL ORDER BY id")
        assert dc.fetchall() == [{"id": 2, "name": "b"}, {"id": 3, "name": "c"}]

    cur.execute("SELECT COUNT(*), SUM(id) FROM items WHERE name IN %s", (("b", "c", "zz"),))
    assert cur.fetchone() == (2, Decimal(5))

    # Queries beyond one table.
    cur.execute("CREATE TABLE tags (item INT, tag VARCHAR(10), PRIMARY KEY (item, tag))")
    cur.executemany("INSERT INTO tags VALUES (%s, %s)", [(1, "new"), (1, "sale"), (3, "sale")])
    cur.execute(
        "SELECT i.name, COUNT(t.tag) FROM items i LEFT JOIN tags t ON t.item = i.id GROUP BY i.name ORDER BY i.name"
    )
    assert cur.fetchall() == (("b", 0), ("c", 1), ("it's \\ \"quoted\"", 2)), cur.fetchall()
    cur.execute("SELECT id FROM items WHERE id IN (SELECT item FROM tags WHERE tag = %s) ORDER BY id", ("sale",))
    assert [r[0] for r in cur.fetchall()] == [1, 3]

    # Errors reach the program as DB-API exceptions carrying MySQL's numbers.
    expect_error(cur, "INSERT INTO items (id, name) VALUES (1, 'dup')", pymysql.err.IntegrityError, 1062)
    expect_error(cur, "INSERT INTO items (id, name) VALUES (%s, %s)", pymysql.err.IntegrityError, 1048, (9, None))
    expect_error(cur, "SELECT * FROM nosuch", pymysql.err.ProgrammingError, 1146)
    expect_error(cur, "SELECT nosuch FROM items", pymysql.err.OperationalError, 1054)
    expect_error(cur, "SELEC 1", pymysql.err.ProgrammingError, 1064)
    expect_error(cur, "INSERT INTO items (id, name) VALUES (10, %s)", pymysql.err.DataError, 1406, ("x" * 21,))
    expect_error(cur, "CREATE TRIGGER t1 BEFORE INSERT ON items FOR EACH ROW SET @x = 1", pymysql.err.NotSupportedError, 1235)
    cur.execute("SELECT 1")
    assert cur.fetchone() == (1,), "the connection is still usable after errors"

    # Transactions: with autocommit off, writes stay pending until COMMIT and ROLLBACK takes
    # them back.
    conn.autocommit(False)
    conn.begin()
    cur.execute("UPDATE items SET price = %s WHERE id = %s", (Decimal("1.50"), 2))
    assert cur.rowcount == 1
    conn.commit()
    conn.begin()
    cur.execute("SELECT price FROM items WHERE id = 2")
    assert cur.fetchone() == (Decimal("1.50"),)
    conn.rollback()
    cur.execute("DELETE FROM items WHERE id = 3")
    conn.rollback()
    conn.autocommit(True)
    cur.execute("SELECT COUNT(*) FROM items")
    assert cur.fetchone() == (3,), "ROLLBACK took the DELETE back"
    conn.autocommit(False)
    cur.execute("DELETE FROM items WHERE id = 3")
    conn.commit()
    conn.autocommit(True)
    cur.execute("SELECT COUNT(*) FROM items")
    assert cur.fetchone() == (2,), "the committed DELETE stays"

    cur.execute("DROP DATABASE pydb")
    cur.close()
    conn.close()
    print("pymysql DB-API script: ok")


if __name__ == "__main__":
    main()
