-- title: JOIN ... USING and NATURAL JOIN are joins ON the equal columns; * shows each USING column once (a RIGHT JOIN's from its right side), then the left's columns, then the right's
-- sources: t(k, a, j); u(k, b, j); w(j, c)
CREATE VIEW inner_using AS
SELECT * FROM t JOIN w USING (j);
CREATE VIEW natural_then_using AS
SELECT * FROM t NATURAL JOIN u JOIN w USING (j);
CREATE VIEW right_using AS
SELECT k, a, u.b FROM t RIGHT JOIN u USING (k)
