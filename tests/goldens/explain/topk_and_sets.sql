-- title: TopK (global and per group) buffered, and on a tower over an aggregate; DISTINCT, UNION, INTERSECT ALL, EXCEPT as thresholds
-- sources: orders(o_orderkey, o_custkey, o_totalprice, o_orderdate); customer(c_custkey, c_name, c_mktsegment)
CREATE VIEW biggest_orders AS
SELECT o_orderkey, o_totalprice FROM orders ORDER BY o_totalprice DESC, o_orderkey LIMIT 10;
-- ivm: topk_spare = 5
CREATE VIEW top3_per_customer AS
SELECT * FROM (
  SELECT o_custkey, o_orderkey, o_totalprice,
         ROW_NUMBER() OVER (PARTITION BY o_custkey ORDER BY o_totalprice DESC) AS rn
  FROM orders
) WHERE rn <= 3;
-- ivm: expected_group_size = 100
CREATE VIEW top_spenders AS
SELECT o_custkey, sum(o_totalprice) AS spent FROM orders GROUP BY o_custkey
ORDER BY spent DESC, o_custkey LIMIT 5;
CREATE VIEW segments AS SELECT DISTINCT c_mktsegment FROM customer;
CREATE VIEW all_keys AS SELECT o_custkey AS k FROM orders UNION SELECT c_custkey FROM customer;
CREATE VIEW ordering_customers AS
SELECT c_custkey FROM customer INTERSECT ALL SELECT o_custkey FROM orders;
CREATE VIEW idle_customers AS SELECT c_custkey FROM customer EXCEPT SELECT o_custkey FROM orders
