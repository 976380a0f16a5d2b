CREATE VIEW s_except AS
SELECT o_custkey FROM orders WHERE o_orderstatus = 'O'
EXCEPT SELECT c_custkey FROM customer WHERE c_mktsegment = 'BUILDING'
