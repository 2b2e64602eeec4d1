/*
 * ember_pack_floats(array<float|double>) -> binary: a row's numbers as one little-endian float32
 * buffer (issue 23, point 4); ember_unpack_floats, its inverse.
 *
 * Why: a Python worker receives an array column from Spark's JVM written element by element
 * into Arrow (ArrayType), which caps every evaluator in a Python worker near 1.25-1.42x
 * predict_batch_udf.  A binary column crosses as one copy per row, and a batch of equal-length
 * rows arrives as one contiguous buffer that numpy views without a copy.  For array<float> held
 * as UnsafeArrayData (what a scan, a cache and a projection hand over) the values are one bulk
 * copy here as well.
 *
 * A null row gives null (the caller names it); a null element is an error naming the element.
 * Registered by EmberExtensions (spark.sql.extensions), called by name from classic PySpark and
 * Spark Connect alike: F.call_function("ember_pack_floats", col).
 */
package org.ember.spark

import java.nio.{ByteBuffer, ByteOrder}

import org.apache.spark.sql.SparkSessionExtensions
import org.apache.spark.sql.catalyst.FunctionIdentifier
import org.apache.spark.sql.catalyst.analysis.TypeCheckResult
import org.apache.spark.sql.catalyst.expressions.{Expression, ExpressionInfo, UnaryExpression, UnsafeArrayData}
import org.apache.spark.sql.catalyst.expressions.codegen.{CodegenContext, ExprCode}
import org.apache.spark.sql.catalyst.util.ArrayData
import org.apache.spark.sql.types.{ArrayType, BinaryType, DataType, DoubleType, FloatType}
import org.apache.spark.unsafe.Platform

/** What Ember's functions share: a null-intolerant call of one argument, evaluated by a static
 *  method `call(value[, extra], what)` in both interpreted and generated code.  `what`: the
 *  argument's SQL text when the function was called (the column), for errors; the bound child's
 *  own text no longer names it. */
abstract class EmberCall extends UnaryExpression {
  def what: String
  protected def call: String   // the static method, fully named
  protected def extra: String  // ", arg" passed between the value and `what`, or ""
  override def nullIntolerant: Boolean = true

  override protected def doGenCode(ctx: CodegenContext, ev: ExprCode): ExprCode = {
    val name = ctx.addReferenceObj("what", what, "java.lang.String")
    defineCodeGen(ctx, ev, c => s"$call($c$extra, $name)")
  }
}

case class PackFloats(child: Expression, what: String) extends EmberCall {
  override def dataType: DataType = BinaryType
  override protected def call: String = "org.ember.spark.PackFloats.pack"
  override protected def extra: String = s", $isDouble"
  override def prettyName: String = PackFloats.Name

  override def checkInputDataTypes(): TypeCheckResult = child.dataType match {
    case ArrayType(FloatType | DoubleType, _) => TypeCheckResult.TypeCheckSuccess
    case other => TypeCheckResult.TypeCheckFailure(
      s"${PackFloats.Name} takes an array of float or double; ${child.sql} is ${other.catalogString}")
  }

  private def isDouble: Boolean = child.dataType.asInstanceOf[ArrayType].elementType == DoubleType

  override protected def nullSafeEval(input: Any): Any =
    PackFloats.pack(input.asInstanceOf[ArrayData], isDouble, what)

  override protected def withNewChildInternal(newChild: Expression): PackFloats = copy(child = newChild)
}

object PackFloats {
  val Name = "ember_pack_floats"
  private val LittleEndian = ByteOrder.nativeOrder() == ByteOrder.LITTLE_ENDIAN

  /** The values of `a` as little-endian float32 bytes; doubles are narrowed to float.  `what`
   *  (the argument's SQL text: the column) is named in the error about a null element. */
  def pack(a: ArrayData, isDouble: Boolean, what: String): Array[Byte] = {
    val n = a.numElements()
    val out = new Array[Byte](n * 4)
    a match {
      case u: UnsafeArrayData if !isDouble && LittleEndian =>
        val header = UnsafeArrayData.calculateHeaderPortionInBytes(n)
        // The null bits are the header's words after the element count.
        var w = 8
        while (w < header) {
          if (Platform.getLong(u.getBaseObject, u.getBaseOffset + w) != 0L) nullElement(a, n, what)
          w += 8
        }
        Platform.copyMemory(u.getBaseObject, u.getBaseOffset + header, out, Platform.BYTE_ARRAY_OFFSET, n * 4L)
      case _ =>
        // Any other array (a Parquet scan's ColumnarArray, a GenericArrayData): nulls checked,
        // then the values in bulk where the array allows it (ColumnarArray copies its slice of
        // the column vector at once), and one bulk put into the little-endian buffer.
        var i = 0
        while (i < n) {
          if (a.isNullAt(i)) nullElement(a, n, what)
          i += 1
        }
        val floats = if (isDouble) {
          val d = a.toDoubleArray()
          val f = new Array[Float](n)
          var j = 0
          while (j < n) { f(j) = d(j).toFloat; j += 1 }
          f
        } else a.toFloatArray()
        ByteBuffer.wrap(out).order(ByteOrder.LITTLE_ENDIAN).asFloatBuffer().put(floats)
    }
    out
  }

  private def nullElement(a: ArrayData, n: Int, what: String): Nothing = {
    val i = (0 until n).find(a.isNullAt).getOrElse(-1)
    throw new IllegalArgumentException(
      s"$Name($what): element $i of a row's array (of $n) is null; the model needs a number in each")
  }
}

/** ember_unpack_floats(binary) -> array<float>: ember_pack_floats undone (one buffer per row back
 *  into an array column: cluster.inference restores the packed input columns it hands back). */
case class UnpackFloats(child: Expression, what: String) extends EmberCall {
  override def dataType: DataType = ArrayType(FloatType, containsNull = false)
  override protected def call: String = "org.ember.spark.UnpackFloats.unpack"
  override protected def extra: String = ""
  override def prettyName: String = UnpackFloats.Name

  override def checkInputDataTypes(): TypeCheckResult = child.dataType match {
    case BinaryType => TypeCheckResult.TypeCheckSuccess
    case other => TypeCheckResult.TypeCheckFailure(
      s"${UnpackFloats.Name} takes a binary value; ${child.sql} is ${other.catalogString}")
  }

  override protected def nullSafeEval(input: Any): Any = UnpackFloats.unpack(input.asInstanceOf[Array[Byte]], what)

  override protected def withNewChildInternal(newChild: Expression): UnpackFloats = copy(child = newChild)
}

object UnpackFloats {
  val Name = "ember_unpack_floats"

  def unpack(b: Array[Byte], what: String): ArrayData = {
    if (b.length % 4 != 0) throw new IllegalArgumentException(
      s"$Name($what): a value of ${b.length} bytes is not a whole number of float32s")
    val floats = new Array[Float](b.length / 4)
    ByteBuffer.wrap(b).order(ByteOrder.LITTLE_ENDIAN).asFloatBuffer().get(floats)
    UnsafeArrayData.fromPrimitiveArray(floats)
  }
}

/** spark.sql.extensions=org.ember.spark.EmberExtensions registers Ember's SQL functions. */
class EmberExtensions extends (SparkSessionExtensions => Unit) {
  override def apply(e: SparkSessionExtensions): Unit = {
    register(e, classOf[PackFloats], PackFloats.Name, "an array of float or double",
      "_FUNC_(array) - the array's numbers as one little-endian float32 binary value", PackFloats(_, _))
    register(e, classOf[UnpackFloats], UnpackFloats.Name, "a binary value",
      "_FUNC_(binary) - little-endian float32 bytes as an array of float", UnpackFloats(_, _))
    // cluster.inference's join by position (InferByPosition.scala).
    e.injectPlannerStrategy(_ => org.apache.spark.sql.ember.EmberInferStrategy)
  }

  /** One function of one argument, built with the argument's SQL text (its `what`). */
  private def register(e: SparkSessionExtensions, cls: Class[_], name: String, takes: String, usage: String,
                       make: (Expression, String) => Expression): Unit = {
    val info = new ExpressionInfo(cls.getName, null, name, usage, "")
    e.injectFunction((FunctionIdentifier(name), info, (args: Seq[Expression]) => args match {
      case Seq(c) => make(c, c.sql)
      case _ => throw new IllegalArgumentException(s"$name takes one argument ($takes), got ${args.length}")
    }))
  }
}
