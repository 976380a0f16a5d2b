-- title: constant join conditions: ON false pads the preserved side (the never-matched input read for its types only), an inner ON false is empty, ON true is dropped
-- sources: l2(lk, ls); r2(rk, rd)
CREATE VIEW nested_left_false AS
SELECT * FROM (((SELECT 1 AS x FROM l2) LEFT JOIN (SELECT 1 AS y FROM r2) ON false) LEFT JOIN (SELECT 1 AS z FROM r2) ON false);
CREATE VIEW right_one_is_zero AS
SELECT ls, rd FROM l2 RIGHT JOIN r2 ON 1 = 0;
CREATE VIEW inner_false AS
SELECT ls, rd FROM l2 JOIN r2 ON lk = rk AND false;
CREATE VIEW left_true_and_key AS
SELECT ls, rd FROM l2 LEFT JOIN r2 ON true AND lk = rk
