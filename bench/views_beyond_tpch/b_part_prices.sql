CREATE VIEW b_part_prices AS
SELECT l_partkey,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY l_extendedprice) AS median_price,
       percentile_disc(0.9) WITHIN GROUP (ORDER BY l_quantity) AS p90_quantity,
       year(max(l_shipdate)) AS last_year
FROM lineitem GROUP BY l_partkey
