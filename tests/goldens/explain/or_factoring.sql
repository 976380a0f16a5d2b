-- title: a conjunct common to every branch of an OR is a conjunct of the whole: an equality in each branch is a join key, a filter in each branch filters its input, a branch left empty makes the OR true
-- sources: t(a, b, c); u(a, d, e)
CREATE VIEW keyed_in_each_branch AS
SELECT t.b, u.d FROM t, u
WHERE (t.a = u.a AND t.b > 1 AND u.e = 'x') OR (u.a = t.a AND u.d < 5 AND u.e = 'x');
CREATE VIEW on_clause AS
SELECT t.b, u.d FROM t JOIN u ON (t.a = u.a AND t.c = 1) OR (t.a = u.a AND t.c = 2);
CREATE VIEW absorbed AS
SELECT b FROM t WHERE (b > 1 AND c = 2) OR b > 1;
CREATE VIEW nothing_common AS
SELECT b FROM t WHERE (b > 1 AND c = 2) OR (b < 0 AND c = 3)
