-- title: a self-join and a join of a view with a source share the orders-by-customer arrangement
-- sources: orders(o_orderkey, o_custkey, o_totalprice); customer(c_custkey, c_name)
CREATE VIEW pairs AS
SELECT a.o_orderkey AS first, b.o_orderkey AS second
FROM orders a JOIN orders b ON a.o_custkey = b.o_custkey
WHERE a.o_orderkey < b.o_orderkey;
CREATE VIEW named_pairs AS
SELECT c.c_name, p.first, p.second
FROM pairs p JOIN orders o ON o.o_orderkey = p.first JOIN customer c ON c.c_custkey = o.o_custkey
