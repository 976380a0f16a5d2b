-- title: outer joins of more than two inputs, and inner joins after outer ones: the inputs before each such join become an internal view (a two-input join each); a key computed over them is its column; WHERE on a LEFT join's preserved inputs filters the internal view
-- sources: t(k, a, j); u(k, b, j); w(j, c)
CREATE VIEW left_left AS
SELECT t.a, u.b, w.c FROM t LEFT JOIN u ON u.k = t.k LEFT JOIN w ON w.j = u.j WHERE t.a > 0;
CREATE VIEW full_full AS
SELECT coalesce(t.j, u.j, w.j) AS j, a, b, c FROM t FULL JOIN u ON u.j = t.j FULL JOIN w ON w.j = coalesce(t.j, u.j);
CREATE VIEW inner_right AS
SELECT t.a, u.b, w.c FROM t JOIN u ON u.k = t.k RIGHT JOIN w ON w.j = u.j;
CREATE VIEW left_then_inner AS
SELECT *, w.c AS c2 FROM t LEFT JOIN (SELECT k, b FROM u) v USING (k) JOIN w USING (j)
