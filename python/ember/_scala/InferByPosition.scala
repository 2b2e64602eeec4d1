/*
 * A Python function's answers appended to the rows Spark kept, by position, without the rows
 * crossing back from Python: cluster.inference's join (issue 23, point 4) and
 * KerasModel.transform's.
 *
 * Why: `mapInArrow` hands Spark only what its Python function returns, so a feeding task must
 * send every input column back (a 784-float row: 3 KB through the worker's socket, into Arrow,
 * into an UnsafeRow, then unpacked).  Spark's own scalar Python UDFs avoid that: ArrowEvalPython
 * keeps each input row in a queue in the JVM, sends Python only the UDF's arguments, and joins
 * the results to the queued rows by position.  Its Python side for pandas UDFs converts to pandas
 * and back (a binary column becomes one Python bytes object per row: 4.3 us of a 3 KB row);
 * EmberInferExec runs the same queue and join (Spark's EvalPythonExec) with mapInArrow's Python
 * side instead (Arrow record batches in and out, no pandas), over one argument: a struct of the
 * columns the caller names (cluster.inference: every column, array<float> ones packed by
 * ember_pack_floats; KerasModel: its input column, packed).  The Python function must answer
 * exactly as many rows as it was given, in order (Ember's callers check that per batch; an
 * extra row fails in EvalPythonExec's queue).
 *
 * Called from classic PySpark through py4j (a Connect client goes on as before); planned by
 * EmberInferStrategy, which EmberExtensions injects.  It lives in a package under
 * org.apache.spark.sql, as Delta's classes do: PythonFunction, Dataset.ofRows and Spark's Python
 * runners are visible there only.
 */
package org.apache.spark.sql.ember

import scala.jdk.CollectionConverters._

import org.apache.spark.{JobArtifactSet, TaskContext}
import org.apache.spark.api.python.{ChainedPythonFunctions, PythonFunction}
import org.apache.spark.sql.{Column, Row}
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{Alias, Attribute, AttributeReference, AttributeSet, CreateStruct,
  GetStructField, NamedExpression, PythonUDF}
import org.apache.spark.sql.catalyst.plans.logical.{LogicalPlan, Project, UnaryNode}
import org.apache.spark.sql.classic.Dataset
import org.apache.spark.sql.execution.{SparkPlan, SparkStrategy}
import org.apache.spark.sql.execution.metric.SQLMetric
import org.apache.spark.sql.execution.python.{ArrowPythonRunner, EvalPythonEvaluatorFactory,
  EvalPythonExec, PythonSQLMetrics}
import org.apache.spark.sql.execution.python.EvalPythonExec.ArgumentMetadata
import org.apache.spark.sql.types.{ArrayType, BinaryType, DataType, StringType, StructType}

object InferByPosition {
  /** pyspark.util.PythonEvalType.SQL_MAP_ARROW_ITER_UDF: record batches in, record batches out. */
  val MapArrowIter = 207

  /** `df`'s rows with `resultJson`'s fields (a StructType as JSON) appended: `func` (a pickled
   *  mapInArrow function, pyspark's _wrap_function) receives record batches of the columns
   *  `args` (expressions over `df`'s columns, each named: a column, or e.g. ember_pack_floats of
   *  one, aliased) and answers record batches of the result fields, row for row.  `name` names
   *  the caller in errors (cluster.inference, KerasModel). */
  def apply(df: Dataset[Row], func: PythonFunction, args: Array[Column], resultJson: String,
            name: String, batchBytes: Long): Dataset[Row] = {
    val result = DataType.fromJson(resultJson) match {
      case s: StructType => s
      case other => throw new IllegalArgumentException(s"$name: the result type must be a struct, got " +
        other.catalogString)
    }
    if (args.isEmpty) throw new IllegalArgumentException(s"$name: no columns to send to Python")
    if (batchBytes <= 0) {
      throw new IllegalArgumentException(s"$name: batchBytes must be positive, got $batchBytes")
    }
    val child = df.queryExecution.analyzed
    // The arguments resolved against `df` as its select would resolve them: the projection's
    // expressions refer to `child`'s attributes.
    val fed = df.select(args.toSeq: _*).queryExecution.analyzed match {
      case Project(list, c) if c.output.map(_.exprId) == child.output.map(_.exprId) => list
      case other => throw new IllegalArgumentException(
        s"$name: the columns sent to Python must be expressions over the DataFrame's columns, got " +
          other.simpleString(200))
    }
    val udf = PythonUDF(name, func, result, Seq(CreateStruct(fed)), MapArrowIter, udfDeterministic = true,
      NamedExpression.newExprId)
    val out = AttributeReference("__ember_result", result, nullable = true)()
    val appended = result.fields.toSeq.zipWithIndex.map { case (f, i) =>
      Alias(GetStructField(out, i, Some(f.name)), f.name)()
    }
    Dataset.ofRows(df.sparkSession, Project(child.output ++ appended, EmberInfer(udf, out, batchBytes, child)))
  }
}

/** `child`'s rows with `udf`'s result (`result`, a struct) appended, row for row; the rows go to
 *  Python in Arrow batches of about `batchBytes` (and at most maxRecordsPerBatch rows). */
case class EmberInfer(udf: PythonUDF, result: Attribute, batchBytes: Long, child: LogicalPlan) extends UnaryNode {
  override def output: Seq[Attribute] = child.output :+ result
  override def producedAttributes: AttributeSet = AttributeSet(result)
  override protected def withNewChildInternal(newChild: LogicalPlan): EmberInfer = copy(child = newChild)
}

object EmberInferStrategy extends SparkStrategy {
  override def apply(plan: LogicalPlan): Seq[SparkPlan] = plan match {
    case EmberInfer(udf, result, batchBytes, child) =>
      EmberInferExec(Seq(udf), Seq(result), batchBytes, planLater(child)) :: Nil
    case _ => Nil
  }
}

/** Spark's EvalPythonExec (rows queued in the JVM, the UDF's arguments sent to Python in Arrow
 *  batches, results joined by position) with mapInArrow's runner protocol: plain argument
 *  offsets, Arrow record batches both ways. */
case class EmberInferExec(udfs: Seq[PythonUDF], resultAttrs: Seq[Attribute], batchBytes: Long, child: SparkPlan)
  extends EvalPythonExec with PythonSQLMetrics {

  private[this] val jobArtifactUUID = JobArtifactSet.getCurrentJobArtifactState.map(_.uuid)

  override protected def evaluatorFactory: EvalPythonEvaluatorFactory = new EmberInferEvaluatorFactory(
    child.output, udfs, output, conf.arrowMaxRecordsPerBatch, batchBytes, conf.sessionLocalTimeZone,
    conf.arrowUseLargeVarTypes, ArrowPythonRunner.getPythonRunnerConfMap(conf), pythonMetrics, jobArtifactUUID,
    conf.pythonUDFProfiler)

  override protected def withNewChildInternal(newChild: SparkPlan): EmberInferExec = copy(child = newChild)
}

class EmberInferEvaluatorFactory(
    childOutput: Seq[Attribute], udfs: Seq[PythonUDF], output: Seq[Attribute], batchRows: Int, batchBytes: Long,
    timeZone: String, largeVarTypes: Boolean, runnerConf: Map[String, String], metrics: Map[String, SQLMetric],
    jobArtifactUUID: Option[String], profiler: Option[String])
  extends EvalPythonEvaluatorFactory(childOutput, udfs, output) {

  private val resultTypes = udfs.map(_.dataType)

  override def evaluate(
      funcs: Seq[(ChainedPythonFunctions, Long)], argMetas: Array[Array[ArgumentMetadata]], iter: Iterator[InternalRow],
      schema: StructType, context: TaskContext): Iterator[InternalRow] = {
    val batches = new SizedBatches(iter, if (batchRows > 0) batchRows else Int.MaxValue, batchBytes, schema)
    val offsets = argMetas.map(_.map(_.offset))
    val results = new ArrowPythonRunner(funcs, InferByPosition.MapArrowIter, offsets, schema, timeZone, largeVarTypes,
      runnerConf, metrics, jobArtifactUUID, profiler).compute(batches, context.partitionId(), context)
    results.flatMap { batch =>
      val types = (0 until batch.numCols()).map(i => batch.column(i).dataType())
      if (types != resultTypes) throw new IllegalStateException(
        s"${udfs.head.name}: the results came back as ${types.map(_.catalogString).mkString(", ")}, " +
          s"expected ${resultTypes.map(_.catalogString).mkString(", ")}")
      batch.rowIterator.asScala
    }
  }
}

/** `rows` in batches of at most `maxRows` rows and about `maxBytes` (a batch ends after the row
 *  that reaches it), each batch to be consumed before the next is asked for (the runner's writer
 *  does).  Why bytes: a node keeps its last batch while it asks for the next, so batches that
 *  fill a large share of its feed ring make each wrap copy the kept one (ring.cc's revoke); a
 *  784-float image row is 3 KB, and Spark's 10,000-row default would be 31 MB of a 64 MiB ring. */
class SizedBatches(rows: Iterator[InternalRow], maxRows: Int, maxBytes: Long, schema: StructType)
  extends Iterator[Iterator[InternalRow]] {

  private val sizeOf = SizedBatches.estimator(schema)

  override def hasNext: Boolean = rows.hasNext

  override def next(): Iterator[InternalRow] = {
    if (!rows.hasNext) throw new NoSuchElementException("no more rows")
    new Iterator[InternalRow] {
      private var count = 0
      private var bytes = 0L
      override def hasNext: Boolean = count < maxRows && bytes < maxBytes && rows.hasNext
      override def next(): InternalRow = {
        if (!hasNext) throw new NoSuchElementException("the batch is full")
        val row = rows.next()
        count += 1
        bytes += sizeOf(row)
        row
      }
    }
  }
}

object SizedBatches {
  /** About the Arrow bytes of one row of `schema` (the projected arguments: a struct of the
   *  fed columns): variable-length values by their length, the rest by their type's size. */
  def estimator(schema: StructType): InternalRow => Long = {
    def of(t: DataType): (InternalRow, Int) => Long = t match {
      case BinaryType => (r, i) => if (r.isNullAt(i)) 0L else r.getBinary(i).length.toLong
      case StringType => (r, i) => if (r.isNullAt(i)) 0L else r.getUTF8String(i).numBytes().toLong
      case ArrayType(e, _) => (r, i) => if (r.isNullAt(i)) 0L else r.getArray(i).numElements().toLong * e.defaultSize
      case s: StructType =>
        val fields = s.fields.map(f => of(f.dataType)).zipWithIndex
        (r, i) => if (r.isNullAt(i)) 0L else {
          val inner = r.getStruct(i, s.length)
          fields.foldLeft(0L) { case (sum, (f, j)) => sum + f(inner, j) }
        }
      case other => (_, _) => other.defaultSize.toLong
    }
    val top = schema.fields.map(f => of(f.dataType)).zipWithIndex
    r => top.foldLeft(8L) { case (sum, (f, j)) => sum + f(r, j) }
  }
}
