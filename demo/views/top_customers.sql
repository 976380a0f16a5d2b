-- Top-k per group: each nation's three customers with the largest open order value.
-- ivm: expected_group_size = 10000
CREATE VIEW top_customers AS
SELECT * FROM (
  SELECT c_nationkey, c_custkey, c_name, c_acctbal,
         ROW_NUMBER() OVER (PARTITION BY c_nationkey ORDER BY c_acctbal DESC, c_custkey) AS rn
  FROM customer
) WHERE rn <= 3
