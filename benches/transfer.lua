-- sysbench script: the bank transfer of `shoal bench txn`, for MariaDB/MySQL.
-- Each event: BEGIN; two SELECT ... FOR UPDATE (lower id first); two UPDATEs; COMMIT.
--   sysbench benches/transfer.lua --accounts=10000 [--single-partition=on] prepare|run|cleanup
sysbench.cmdline.options = {
  accounts = {"Number of accounts", 10000},
  ["single-partition"] = {"Pick both accounts close together (adjacent ids)", false},
}

function prepare()
  local con = sysbench.sql.driver():connect()
  con:query("DROP TABLE IF EXISTS accounts")
  con:query("CREATE TABLE accounts (id INT PRIMARY KEY, balance BIGINT NOT NULL) ENGINE=InnoDB")
  local n = sysbench.opt.accounts
  local i = 0
  while i < n do
    local vals = {}
    for j = i, math.min(i + 999, n - 1) do vals[#vals + 1] = string.format("(%d,1000)", j) end
    con:query("INSERT INTO accounts VALUES " .. table.concat(vals, ","))
    i = i + 1000
  end
end

function cleanup()
  local con = sysbench.sql.driver():connect()
  con:query("DROP TABLE IF EXISTS accounts")
end

function thread_init()
  drv = sysbench.sql.driver()
  con = drv:connect()
end

function event()
  local n = sysbench.opt.accounts
  local from = sysbench.rand.uniform(0, n - 1)
  local to
  if sysbench.opt["single-partition"] then
    to = (from + 1) % n
  else
    to = (from + sysbench.rand.uniform(1, n - 1)) % n
  end
  local lo, hi = math.min(from, to), math.max(from, to)
  local amount = sysbench.rand.uniform(1, 10)
  con:query("BEGIN")
  con:query("SELECT balance FROM accounts WHERE id = " .. lo .. " FOR UPDATE")
  con:query("SELECT balance FROM accounts WHERE id = " .. hi .. " FOR UPDATE")
  con:query("UPDATE accounts SET balance = balance - " .. amount .. " WHERE id = " .. from)
  con:query("UPDATE accounts SET balance = balance + " .. amount .. " WHERE id = " .. to)
  con:query("COMMIT")
end
