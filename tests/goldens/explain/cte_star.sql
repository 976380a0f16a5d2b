-- title: CTEs inline, SELECT * expands, ORDER BY without LIMIT is ignored
-- sources: customer(c_custkey, c_name, c_acctbal, c_mktsegment)
CREATE VIEW rich AS
WITH seg AS (SELECT * FROM customer WHERE c_mktsegment = 'BUILDING')
SELECT * FROM seg WHERE c_acctbal > 5000 ORDER BY c_acctbal
