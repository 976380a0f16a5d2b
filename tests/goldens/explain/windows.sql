-- title: window functions: a Window keeps its input's rows by the key every call partitions by and recomputes the partitions a change touches; calls inside expressions and QUALIFY are its columns; order-dependent calls order ties by the other columns; without a common key, one partition; in a grouped query, over the groups
-- sources: t(k, g, a, b)
CREATE VIEW ranked AS
SELECT k, a, rank() OVER (PARTITION BY k ORDER BY a DESC) AS r, a - avg(a) OVER (PARTITION BY k, g) AS dev FROM t;
CREATE VIEW running AS
SELECT k, b, sum(a) OVER (PARTITION BY k ORDER BY b ROWS BETWEEN 2 PRECEDING AND CURRENT ROW) AS moving, lag(a) OVER (PARTITION BY k ORDER BY b) AS prev FROM t;
CREATE VIEW top_dense AS
SELECT k, a FROM t QUALIFY dense_rank() OVER (PARTITION BY k ORDER BY a) <= 2;
CREATE VIEW numbered AS
SELECT k, a, row_number() OVER (ORDER BY a, k) AS n FROM t;
CREATE VIEW group_rank AS
SELECT k, sum(a) AS s, rank() OVER (ORDER BY sum(a) DESC) AS r FROM t GROUP BY k;
CREATE VIEW top_groups AS
SELECT k, sum(b) AS s, rank() OVER (ORDER BY sum(b) DESC) AS r FROM t GROUP BY k QUALIFY r <= 3 AND s > 0
