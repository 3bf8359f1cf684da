import pickle

from hugerec.data.preprocess.errors import MAX_EXAMPLES, BadInputError, RowError, SkipReport


def test_row_error_names_file_line_and_column():
    text = str(RowError("day_0.tsv", "cannot convert String value to Int64", line=17, column="I3", value="abc"))
    assert text == "day_0.tsv, line 17, column 'I3': cannot convert String value to Int64 (value 'abc')"
    assert "row group 2, row 5" in str(RowError("x.parquet", "bad", row_group=2, row=5))


def test_bad_input_error_survives_pickling():
    error = BadInputError(RowError("f.tsv", "3 fields, expected 40", line=9))
    again = pickle.loads(pickle.dumps(error))
    assert isinstance(again, BadInputError) and again.error == error.error and str(again) == str(error)


def test_reports_merge_and_keep_a_bounded_number_of_examples():
    one = SkipReport(10, 1, (RowError("a", "bad", line=1),))
    many = SkipReport(100, 30, tuple(RowError("b", "bad", line=i) for i in range(MAX_EXAMPLES)))
    merged = one.merge(many)
    assert (merged.rows_read, merged.rows_skipped, len(merged.examples)) == (110, 31, MAX_EXAMPLES)
    assert "31 of 110 rows skipped" in str(merged) and "and 11 more" in str(merged)
