-- Customers with a balance band and their country code.
CREATE VIEW customer_bands AS
SELECT c_custkey,
       upper(c_name) AS name,
       CASE WHEN c_acctbal < 0 THEN 'in debt'
            WHEN c_acctbal < 5000 THEN 'standard'
            ELSE 'premium' END AS band,
       substr(c_phone, 1, 2) AS country_code,
       lower(c_mktsegment) AS segment
FROM customer
